"""Models and measurements of cost: memory per device (``memory``), the time of a data-parallel step
(``costmodel``), input pipelines and precision (``perf``), recomputation and accumulation (``tradeoffs``),
checkpoints (``recovery``), what a traced step keeps and moves (``graphs``), and the layout planner (``planner``)."""
