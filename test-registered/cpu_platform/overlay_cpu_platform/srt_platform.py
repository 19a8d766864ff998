"""The platform class SGLang loads for ``SGLANG_PLATFORM=overlay_cpu``.

What it is: SGLang's own CPU device operations (``CpuDeviceMixin``: memory queries, ``cpu``
devices, the gloo process-group backend) on an *out-of-tree* platform, because only an
out-of-tree platform is asked the questions that keep SGLang off its CUDA-only code (PyNccl,
the rotary-embedding kernel fallback, Triton allocators). It answers them with the CPU answer
and sets nothing else.

Where the platform API has no question to ask, ``init_backend()`` (SGLang calls it once per
scheduler process, before the model runner exists) sets the few module attributes listed in
``MODULE_SETTINGS``, each with the error it avoids; ``docs/compatibility.md`` lists the same
rows. Releases differ in what the platform API covers, so each answer is given only where the
installed release asks for it (feature-detected, never by version number).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from sglang.srt.platforms import interface
from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import SRTPlatform

logger = logging.getLogger(__name__)

# What the installed release's platform API can be told (0.5.22+: capabilities; 0.5.23+: PyNccl).
_CAPABILITIES = getattr(interface, "PlatformCapabilities", None)
ASKS_PYNCCL = _CAPABILITIES is not None and "supports_pynccl" in _CAPABILITIES.__struct_fields__

ATTENTION_BACKEND = "torch_native"
# Before 0.5.23 the platform API cannot turn PyNccl off (no ``supports_pynccl``); SGLang's
# PyNccl communicator disables itself when the NCCL library cannot be loaded, as on a machine
# without CUDA libraries. PyPI's torch ships one, so the platform points SGLang's own setting
# for the library's path at a file that does not exist.
NCCL_PATH_ENV = "SGLANG_NCCL_SO_PATH"
NO_NCCL_LIBRARY = "/nonexistent/overlay-cpu-platform/libnccl.so.2"


@dataclass(frozen=True)
class ModuleSetting:
    """One attribute of an SGLang module that ``init_backend`` sets, and the error it avoids."""

    module: str
    attribute: str  # "name" in the module, or "Class.name"
    value: Callable[[ModuleType], Any]  # of the module: a constant, or one of its functions
    avoids: str

    def apply(self) -> bool:
        """Set it; False (nothing set) when the installed release has no such module global."""
        target = importlib.import_module(self.module)
        owner_name, _, name = self.attribute.rpartition(".")
        owner = getattr(target, owner_name) if owner_name else target
        if not owner_name and not hasattr(owner, name):
            return False
        setattr(owner, name, self.value(target))
        return True


def _seq_len_fill_value(_backend: Any) -> int:
    # The padded slots of a DP-attention batch get length 1, as every other backend's do.
    return 1


MODULE_SETTINGS = (
    ModuleSetting(
        "sglang.srt.model_executor.forward_batch_info",
        "_is_cpu",
        lambda _module: True,
        "DP attention's batch padding allocates pinned memory: 'Found no NVIDIA driver'",
    ),
    ModuleSetting(
        "sglang.srt.layers.attention.torch_native_backend",
        "TorchNativeAttnBackend.get_cpu_graph_seq_len_fill_value",
        lambda _module: _seq_len_fill_value,
        "DP attention pads a batch with this fill value; the torch-native backend has none "
        "(NotImplementedError)",
    ),
    ModuleSetting(
        "sglang.srt.distributed.parallel_state",
        "_is_cpu",
        lambda _module: True,
        "all_gather_into_tensor goes through a custom op registered for PrivateUse1 only: "
        "\"Could not run 'sglang::reg_all_gather_into_tensor' ... 'CPU' backend\"",
    ),
    ModuleSetting(
        "sglang.srt.layers.dp_attention",
        "memcpy_func",
        lambda module: module.memcpy_cpu,
        "DP attention's gather copies with a Triton kernel, which needs a GPU driver",
    ),
)


class OverlayCpuPlatform(CpuDeviceMixin, SRTPlatform):
    """SGLang's CPU device operations as an out-of-tree platform (see the module docstring)."""

    _enum = PlatformEnum.OOT
    device_name = "cpu"
    device_type = "cpu"
    if ASKS_PYNCCL:  # no Triton is every release's default
        capabilities = _CAPABILITIES(supports_pynccl=False)

    def get_default_attention_backend(self) -> str:
        return ATTENTION_BACKEND

    def is_pin_memory_available(self, device: Any = None) -> bool:
        return False

    def get_device(self, device_id: int = 0) -> torch.device:
        return torch.device("cpu")

    def __init__(self) -> None:
        super().__init__()
        # Made once per process, when SGLang first resolves its platform: before any
        # process group exists, and inherited by the processes this one spawns.
        if not ASKS_PYNCCL:
            os.environ.setdefault(NCCL_PATH_ENV, NO_NCCL_LIBRARY)

    def init_backend(self) -> None:
        applied = [s for s in MODULE_SETTINGS if s.apply()]
        logger.info(
            "overlay CPU test platform: set %s",
            ", ".join(f"{s.module}.{s.attribute}" for s in applied) or "nothing",
        )

    # --- asked only by releases whose platform API predates per-kind pools (0.5.19-0.5.21) ---

    if not hasattr(SRTPlatform, "get_kv_pool_cls"):

        def get_mha_kv_pool_cls(self) -> type:
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

            return MHATokenToKVPool

        def get_paged_allocator_cls(self) -> type:
            from overlay_cpu_platform.allocator import torch_paged_allocator

            return torch_paged_allocator()
