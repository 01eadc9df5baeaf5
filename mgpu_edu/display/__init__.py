"""What learners see: matplotlib drawings (``viz``), ipywidgets controls (``widgets``), the source of the
functions the lessons run (``source``) and the feedback of the exercises' checks (``check``)."""
