"""The algorithms the lessons teach, one module each: all-reduce (``allreduce``) and the other collectives
(``collectives``: broadcast, reduce, reduce-scatter, all-gather, all-to-all, send/receive), data parallelism by hand
(``parallel``), MirroredStrategy runs (``mirrored``), model and pipeline parallelism (``pipeline``), ZeRO
sharding (``sharding``), tensor and sequence parallelism of a transformer (``tensor``), context parallelism
(``context``: ring attention), expert parallelism (``experts``), DTensor meshes and layouts (``meshes``),
data × tensor × pipeline training (``threed``), communication hidden behind computation (``overlap``: a
collective matmul) and what
asynchronous training's staleness does (``staleness``). Those that run
TensorFlow are checked against the one-device computation in tests/."""
