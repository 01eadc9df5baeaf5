"""Sphinx configuration of the course website (built by docs/site/build.py: `make site`).

The pages are staged by build.py; this file only configures Sphinx, myst-nb and the theme. Nothing
is executed and nothing is downloaded: notebooks render with their stored outputs, widgets from
their saved state with the vendored html-manager, formulas with the vendored MathJax.
"""

import os

project = "mgpu_edu"
author = "the mgpu_edu authors"
copyright = "the mgpu_edu authors, Apache-2.0"  # noqa: A001 - Sphinx's name
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "**/_scratch"]
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3  # "#1--devices" style links to headings resolve
nb_execution_mode = "off"  # the lessons as stored, with their outputs
# only exercise cells are folded (the instructor edition's solutions and checks): say so on their toggle
nb_code_prompt_show = "Show this exercise cell's {type}"
nb_code_prompt_hide = "Hide this exercise cell's {type}"
nb_ipywidgets_js = {"vendor/html-manager/embed.js": {}}  # not the CDN myst-nb would use
mathjax_path = "vendor/mathjax/tex-chtml.js"  # not the CDN Sphinx would use
html_static_path = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_static")]
html_css_files = ["course.css"]  # long code lines wrap instead of being cut off
EDITION = os.environ["MGPU_EDU_SITE_EDITION"]  # "learner" or "instructor" (build.py's --edition)
html_title = f"mgpu_edu: multi-GPU training with TensorFlow and Keras ({EDITION} edition)"
html_theme = "sphinx_book_theme"
html_last_updated_fmt = None
html_context = {"default_mode": "light"}  # with none, the theme logs a console error on a first visit
REPO, REF = os.environ["MGPU_EDU_SITE_REPO"], os.environ["MGPU_EDU_SITE_REF"]  # from lessons/course.toml
html_theme_options = {
    "repository_url": f"https://github.com/{REPO}",
    "repository_branch": REF,
    "path_to_docs": "",
    "use_repository_button": True,
    "launch_buttons": {"binderhub_url": "https://mybinder.org", "colab_url": "https://colab.research.google.com",
                       "notebook_interface": "jupyterlab"},
    "show_toc_level": 2,
    "announcement": os.environ["MGPU_EDU_SITE_BANNER"],  # on every page: which edition this is
}
