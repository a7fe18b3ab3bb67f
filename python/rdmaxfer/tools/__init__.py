"""Tools on top of the library: the ``rdmaxfer`` command (:mod:`.cli`), its benchmark
(:mod:`.bench`, :mod:`.bench_plot`, :mod:`.bench_reference`), ``doctor`` (:mod:`.doctor`) and HTTP
downloads into arrays (:mod:`.fetch`, over :mod:`.ranges` and :mod:`.range_requests`). The top
layer below the package itself."""
