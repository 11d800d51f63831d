"""Own every use of torch's private internals, so that a torch upgrade touches one package.

Callers import this package (``from passkit import _torch``) and never its modules; each module
owns one side of torch:

- ``collectives``: functional collectives and waits, torch's FX bucketing of them;
- ``aoti``: AOTInductor's packages, compiled from an ``ExportedProgram`` and loaded back;
- ``executorch``: ExecuTorch (optional): Edge lowering, delegation, ``.pte`` files and their runtime;
- ``hops``: higher-order ops' subgraphs, and how passkit's tracing forwards them;
- ``dynamo_settings``: the Dynamo settings ``passkit.compile`` runs under on each torch release;
- ``tracing``: fake tensors, functional tracing, re-tracing;
- ``mutations``: which nodes and ops write into their arguments, which values share memory;
- ``random_fills``: in-place random fills traced into the layout eager draws into;
- ``layouts``: values kept in their recorded strides when re-traced, region bodies as cacheable callables;
- ``own_decomps``: decompositions passkit supplies where torch's break a Core ATen program;
- ``ops``: decomposition tables, Core ATen, autograd formulas, random ops, symbolic sizes;
- ``graph_passes``: torch's min-cut partitioner, fake-value propagation, reinplacing;
- ``graph_pickle``: graph modules pickled node by node with their metadata (the compile cache);
- ``inductor`` and ``inductor_cache``: Inductor's inner compiler and its cache form;
- ``inductor_files``: the files Inductor's warm load reads, carried in an entry to other machines;
- ``inductor_warm``: the FX graph key an entry stores, and the CPU capability entries key on;
- ``cpu_probes``: Inductor's CPU probes, run early on a thread and once per machine;
- ``inductor_slots``: the objects a mounted pipeline file puts in Inductor's custom-pass slots;
- ``inductor_workers``: a graph's kernels compiled while the next graph lowers, bundled on the CPU;
- ``shape_guards``: a symbolic program's signature and guards (the compile cache's key and hits);
- ``symbols``: which size symbols a graph input needs and which it binds;
- ``kernel_bundles``: a graph's C++ kernels built as a few libraries, not one each;
- ``logs``: structured trace artifacts and Dynamo's compile ids;
- ``region_values``: each outlined region call's own results, and operands it passes on read directly;
- ``region_calls``: a graph that calls regions compiled as Python calling each distinct body once;
- ``unbacked``: data-dependent sizes (``nonzero``, ``.item()``), the shape environment they need, an export's range constraints;
- ``values``: which values compiled kernels cannot read, and whether a trace records the call;
- ``versions``: which torch release runs, the one module that reads its version (``TORCH_2_15``...).

Supported torch: 2.11 to 2.15 (docs/torch-versions.md lists what differs and where).
"""

from __future__ import annotations

from passkit._torch.aoti import *  # noqa: F403
from passkit._torch.aoti import __all__ as _aoti
from passkit._torch.collectives import *  # noqa: F403
from passkit._torch.collectives import __all__ as _collectives
from passkit._torch.executorch import *  # noqa: F403
from passkit._torch.executorch import __all__ as _executorch
from passkit._torch.dynamo_settings import *  # noqa: F403
from passkit._torch.dynamo_settings import __all__ as _dynamo_settings
from passkit._torch.graph_passes import *  # noqa: F403
from passkit._torch.graph_passes import __all__ as _graph_passes
from passkit._torch.graph_pickle import *  # noqa: F403
from passkit._torch.graph_pickle import __all__ as _graph_pickle
from passkit._torch.hops import *  # noqa: F403
from passkit._torch.hops import __all__ as _hops
from passkit._torch.inductor import *  # noqa: F403
from passkit._torch.inductor import __all__ as _inductor
from passkit._torch.inductor_cache import *  # noqa: F403
from passkit._torch.inductor_cache import __all__ as _inductor_cache
from passkit._torch.inductor_files import *  # noqa: F403
from passkit._torch.inductor_files import __all__ as _inductor_files
from passkit._torch.inductor_warm import *  # noqa: F403
from passkit._torch.inductor_warm import __all__ as _inductor_warm
from passkit._torch.cpu_probes import *  # noqa: F403
from passkit._torch.cpu_probes import __all__ as _cpu_probes
from passkit._torch.inductor_slots import *  # noqa: F403
from passkit._torch.inductor_slots import __all__ as _inductor_slots
from passkit._torch.inductor_workers import *  # noqa: F403
from passkit._torch.inductor_workers import __all__ as _inductor_workers
from passkit._torch.kernel_bundles import *  # noqa: F403
from passkit._torch.kernel_bundles import __all__ as _kernel_bundles
from passkit._torch.logs import *  # noqa: F403
from passkit._torch.logs import __all__ as _logs
from passkit._torch.mutations import *  # noqa: F403
from passkit._torch.mutations import __all__ as _mutations
from passkit._torch.ops import *  # noqa: F403
from passkit._torch.ops import __all__ as _ops
from passkit._torch.own_decomps import *  # noqa: F403
from passkit._torch.own_decomps import __all__ as _own_decomps
from passkit._torch.region_calls import *  # noqa: F403
from passkit._torch.region_calls import __all__ as _region_calls
from passkit._torch.region_values import *  # noqa: F403
from passkit._torch.region_values import __all__ as _region_values
from passkit._torch.regions import *  # noqa: F403
from passkit._torch.regions import __all__ as _regions
from passkit._torch.shape_guards import *  # noqa: F403
from passkit._torch.shape_guards import __all__ as _shape_guards
from passkit._torch.symbols import *  # noqa: F403
from passkit._torch.symbols import __all__ as _symbols
from passkit._torch.tracing import *  # noqa: F403
from passkit._torch.tracing import __all__ as _tracing
from passkit._torch.unbacked import *  # noqa: F403
from passkit._torch.unbacked import __all__ as _unbacked
from passkit._torch.values import *  # noqa: F403
from passkit._torch.values import __all__ as _values
from passkit._torch.versions import *  # noqa: F403
from passkit._torch.versions import __all__ as _versions


__all__ = [
    *_aoti, *_collectives, *_cpu_probes, *_dynamo_settings, *_executorch, *_graph_passes, *_graph_pickle, *_hops, *_inductor, *_inductor_cache, *_inductor_files, *_inductor_warm, *_inductor_slots,
    *_inductor_workers, *_kernel_bundles, *_logs, *_mutations, *_ops, *_own_decomps, *_region_calls, *_region_values, *_regions,
    *_shape_guards, *_symbols, *_tracing, *_unbacked, *_values, *_versions,
]
