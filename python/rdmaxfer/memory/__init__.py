"""Memory: arrays and their kind (:mod:`.buffer`), registrations (:mod:`.region`), message
metadata (:mod:`.meta`), dtype names (:mod:`.dtypes`), DLPack (:mod:`.dlpack`) and GPU memory
views with the CUDA driver's status (:mod:`.cuda`). The lowest layer above the floor
(``_core``, ``errors``, ``_config``)."""
