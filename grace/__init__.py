"""GraCE as a ``torch.compile`` backend: CUDA-graph-aware code transformation (CGCT), parameter
indirection (PI) and selective CUDA graphs (SCG).

``import grace`` must stay cheap and must not import torch eagerly beyond what the public API needs;
``grace`` never imports ``suites``, ``matrix`` or ``dashboards``.
"""

__version__ = "0.1.0"
