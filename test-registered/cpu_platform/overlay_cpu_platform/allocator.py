"""SGLang's paged KV allocator with its two Triton kernels done in torch (0.5.19-0.5.21).

From 0.5.22 SGLang's own ``PagedTokenToKVPoolAllocator`` computes the same thing in torch when
the platform says it has no Triton (``capabilities.supports_triton``); before that the platform
API has no such answer, the allocator always launches Triton kernels (which need a GPU
driver), and an out-of-tree platform must name its allocator class
(``get_paged_allocator_cls``). This is that class: the in-tree allocator, everything inherited
but where a request's new tokens land.

Placement rule (the kernels'): a request's tokens go right after its last slot
(``last_loc + 1``) until its page is full; whole new pages come from the front of
``free_pages`` in request order; the free list then drops the pages taken.
"""

from __future__ import annotations

import torch


def _pages_needed(prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int):
    """Per request: new pages for growing from ``prefix_lens`` to ``seq_lens`` tokens."""
    return (seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size


def place_tokens(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
) -> tuple[torch.Tensor, int]:
    """KV slots for every new token of every request (request order), and pages taken."""
    new_pages = _pages_needed(prefix_lens, seq_lens, page_size)
    first_new_page = torch.cumsum(new_pages, 0) - new_pages
    slots = []
    for i in range(len(seq_lens)):
        prefix, seq = int(prefix_lens[i]), int(seq_lens[i])
        positions = torch.arange(prefix, seq, dtype=torch.int64)
        # Positions before the prefix's page boundary fill its partly used last page.
        boundary = (prefix + page_size - 1) // page_size * page_size
        in_old_page = positions < boundary
        page = first_new_page[i] + ((positions - boundary) // page_size).clamp(min=0)
        fresh = free_pages[page.clamp(max=max(len(free_pages) - 1, 0))] * page_size
        slots.append(
            torch.where(
                in_old_page, last_loc[i] + 1 + positions - prefix, fresh + positions % page_size
            )
        )
    out = torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)
    return out, int(new_pages.sum())


def torch_paged_allocator() -> type:
    """The subclass, built on first use so importing this module needs no SGLang allocator."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.utils import get_num_new_pages

    class TorchPagedTokenToKVPoolAllocator(PagedTokenToKVPoolAllocator):
        def alloc_extend(
            self,
            prefix_lens,
            prefix_lens_cpu,
            seq_lens,
            seq_lens_cpu,
            last_loc,
            extend_num_tokens,
            num_new_pages=None,
        ):
            if extend_num_tokens // self.page_size + len(prefix_lens) + 1 > len(self.free_pages):
                self.merge_and_sort_free()
            if num_new_pages is None:
                num_new_pages = get_num_new_pages(
                    seq_lens=seq_lens_cpu, page_size=self.page_size, prefix_lens=prefix_lens_cpu
                )
            if num_new_pages > len(self.free_pages):
                return None
            out, taken = place_tokens(
                prefix_lens.cpu(), seq_lens.cpu(), last_loc.cpu(), self.free_pages, self.page_size
            )
            self.free_pages = self.free_pages[taken:]
            return out.to(self.device)

        def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
            if len(seq_lens) > len(self.free_pages):
                self.merge_and_sort_free()
            num_new_pages = get_num_new_pages(
                seq_lens=seq_lens_cpu, page_size=self.page_size, decode=True
            )
            if num_new_pages > len(self.free_pages):
                return None
            out, taken = place_tokens(
                seq_lens.cpu() - 1, seq_lens.cpu(), last_loc.cpu(), self.free_pages, self.page_size
            )
            self.free_pages = self.free_pages[taken:]
            return out.to(self.device)

    return TorchPagedTokenToKVPoolAllocator
