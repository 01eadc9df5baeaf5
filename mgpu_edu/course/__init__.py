"""The course and its tooling.

- ``manifest``: the course as data (``lessons/course.toml``), its links, badges and checks; its names
  are re-exported here, so ``from mgpu_edu import course; course.load()`` reads the manifest;
- ``markers``, ``preprocessors``, ``assignments``: nbgrader's markers, the preprocessors that make a
  student version, and student versions and grading built on them (the exercises' checks themselves
  are what learners see: ``mgpu_edu.display.check``);
- ``cli`` and ``doctor``: the ``mgpu-edu`` command; ``python -m mgpu_edu.course`` points the
  lessons, the README and student/ at the manifest (``__main__``).
"""

from mgpu_edu.course.manifest import (
    CELL_ROLE,
    COLAB_GPU,
    INSTALLS,
    MANIFEST,
    REQUIRED_HEADINGS,
    STUDENT,
    UNNUMBERED_HEADINGS,
    Course,
    Lesson,
    ManifestError,
    badge_row,
    binder_url,
    check_folder,
    check_ref,
    check_slug,
    colab_url,
    configure,
    configure_notebook,
    install_cell,
    install_table,
    lesson_files,
    lesson_problems,
    lesson_table,
    load,
    readme_blocks,
    requirement,
    set_defaults,
    shipped,
    shipped_folder,
    start_links,
    student_badges,
    tidy_notebook,
)

__all__ = [
    "CELL_ROLE", "COLAB_GPU", "INSTALLS", "MANIFEST", "REQUIRED_HEADINGS", "STUDENT", "UNNUMBERED_HEADINGS",
    "Course", "Lesson", "ManifestError", "badge_row", "binder_url", "check_folder", "check_ref", "check_slug",
    "colab_url", "configure", "configure_notebook", "install_cell", "install_table", "lesson_files",
    "lesson_problems", "lesson_table", "load", "readme_blocks", "requirement", "set_defaults", "shipped",
    "shipped_folder", "start_links", "student_badges", "tidy_notebook",
]
