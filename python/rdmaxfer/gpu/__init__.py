"""GPU memory on the wire: the GPUDirect decision (:mod:`.gpudirect`), the PCIe topology
(:mod:`.topology`), the staging pipelines (:mod:`.staging`) and what ``rdmaxfer info`` prints
(:mod:`.report`). Above :mod:`rdmaxfer.memory`, below :mod:`rdmaxfer.transport`."""
