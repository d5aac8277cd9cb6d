"""Tensor-parallel (TP) workloads and their harness: Megatron-style sharding written here, no TP library.

The paper evaluates GraCE with tensor parallelism (XLNet at TP-4): every rank runs one shard of the model
in its own process, and the all-reduces that complete the row-parallel layers sit inside the graphs that
``torch.compile`` (and CUDA graphs) capture.

Modules, one concept each:
- ``collectives``: the TP group and the one traced collective (an all-reduce sum through
  ``torch.distributed._functional_collectives``), plus the eager broadcasts that make every rank start
  from rank 0's weights and inputs;
- ``layers``: shard math and the column-/row-parallel linear layers;
- ``models``: an XLNet-style block stack and an LLM-decode-style MLP stack, each as an unsharded
  reference and a function that shards it;
- ``workloads``: the TP workload table (sizes per tier, code hash);
- ``results``: the versioned JSON file one run writes per workload;
- ``run``: the entry point, ``torchrun --nproc-per-node N -m suites.tp.run ...``.
- ``options``, ``launch``, ``recording``: the pytest suite around it (suites/test_tp.py, marker ``tp``):
  its ``--tp-sizes`` option, one torchrun per workload and TP size launched with a timeout, and the
  results file turned into ``suites.records`` records.

Invariant: the TP model of every workload is cut from the unsharded reference model (never initialised
on its own), so on every rank its output must equal the reference's up to reduction order.
"""
