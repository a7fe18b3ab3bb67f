"""Connections: the engine (:mod:`.engine`) and its memory side (:mod:`.domain`), endpoints
(:mod:`.endpoint`) with the receive step (:mod:`.receive`), posted transfers (:mod:`.transfer`)
and their notifications (:mod:`.notifications`), argument checks (:mod:`.args`), and the
module-level conveniences on a default engine (:mod:`.api`). Above :mod:`rdmaxfer.memory` and
:mod:`rdmaxfer.gpu`."""
