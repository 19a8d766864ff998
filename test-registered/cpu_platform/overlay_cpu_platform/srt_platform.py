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

import ctypes
import importlib
import logging
import os
import zlib
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
        """Set it; False (nothing set) when the installed release has no such module, or no
        such module global."""
        try:
            target = importlib.import_module(self.module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not self.module.startswith(exc.name):
                raise
            return False
        owner_name, _, name = self.attribute.rpartition(".")
        owner = getattr(target, owner_name) if owner_name else target
        if not owner_name and not hasattr(owner, name):
            return False
        setattr(owner, name, self.value(target))
        return True


def _seq_len_fill_value(_backend: Any) -> int:
    # The padded slots of a DP-attention batch get length 1, as every other backend's do.
    return 1


def _cpu_all_to_all(module: ModuleType) -> Callable[..., None]:
    """``GroupCoordinator.all_to_all_single`` sending CPU tensors through the group's own
    ``_all_to_all_single`` (``torch.distributed`` on its gloo group); any other tensor as
    before."""
    original = module.GroupCoordinator.all_to_all_single
    if getattr(original, "overlay_cpu_platform", False):
        return original

    def all_to_all_single(self: Any, output: torch.Tensor, input: torch.Tensor) -> None:
        if self.world_size > 1 and input.device.type == "cpu":
            self._all_to_all_single(output, input)
            return
        original(self, output, input)

    all_to_all_single.overlay_cpu_platform = True  # type: ignore[attr-defined]
    return all_to_all_single


CHECKSUM_LOG = "overlay CPU test platform: KV checksum %#010x over %d pages"


def _cpu_kv_checksum(
    self: Any, kv_page_indices: torch.Tensor, state_indices: torch.Tensor | None = None
) -> int:
    """``KvChecksumComputer.compute`` on the CPU: one Adler-32 over the items the CUDA kernel
    digests, in its order. Item ``p`` of buffer ``i`` is the bytes ``[ptr_i + p * len_i,
    + len_i)``; the KV buffers first (each over every page index), then the state buffers
    (each over the state indices). No item at all gives 1, as the kernel does. Each digest is
    logged (``CHECKSUM_LOG``), so a test can compare what both sides of a transfer computed."""
    kv_buffers = zip(self._kv_data_ptrs, self._kv_item_lens, strict=True)
    items = [(ptr, n, kv_page_indices) for ptr, n in kv_buffers]
    if self._state_data_ptrs:
        items += [
            (ptr, n, state_indices)
            for ptr, n in zip(self._state_data_ptrs, self._state_item_lens, strict=True)
        ]
    digest = 1
    for ptr, length, indices in items:
        for index in indices.reshape(-1).tolist():
            digest = zlib.adler32(ctypes.string_at(ptr + index * length, length), digest)
    logger.info(CHECKSUM_LOG, digest, kv_page_indices.numel())
    return digest


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
    # Prefill/decode disaggregation (Mooncake's TCP transport).
    ModuleSetting(
        "sglang.srt.disaggregation.mooncake.conn",
        "MooncakeKVSender.supports_host_tensor_indices",
        lambda _module: False,
        "the prefill's first KV send stages page indices in pinned host memory and records a "
        "CUDA event: 'Found no NVIDIA driver' (off, the sender takes page indices the way the "
        "other backends' senders do)",
    ),
    ModuleSetting(
        "sglang.srt.distributed.parallel_state",
        "GroupCoordinator.all_to_all_single",
        _cpu_all_to_all,
        "an attention-DP decode's LM-head all-to-all goes through a custom op registered for "
        "PrivateUse1 only: \"Could not run 'sglang::reg_all_to_all_single' ... 'CPU' "
        'backend"',
    ),
    ModuleSetting(
        "sglang.srt.disaggregation.checksum",
        "KvChecksumComputer.compute",
        lambda _module: _cpu_kv_checksum,
        "--disaggregation-enable-kv-checksum digests the KV pages with a CUDA kernel over "
        "device pointers (asserts CUDA index tensors)",
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
