"""Page-locked ("pinned") host memory for CUDA: registering a mapped buffer so copies to a GPU are DMA.

A host buffer that CUDA does not know is pageable: every host-to-device copy from it is staged through a
driver bounce buffer, synchronously, at a fraction of the link's speed. Registering the buffer
(``cudaHostRegister``) page-locks it, so copies from it run at the link's pinned-copy peak and may be
asynchronous (``non_blocking=True``: the copy is queued on a CUDA stream and the buffer must stay valid until
the stream has passed it). The daemon pins its L2 segment in its own process; an engine that maps the
segment pins its own mapping the same way (registration is per process and per virtual address).

Registration touches and locks every page of the buffer, so it is only done for memory meant to be used
whole (a daemon's default L2 segment), never for sparse pools. Without CUDA (or when the driver refuses) it
is a logged no-op and copies stay pageable: correct, only slower.

Primitives:
    cuda_present: whether this process can use CUDA (and so whether pinning means anything).
    pin: register a contiguous CPU tensor's bytes as pinned; True when they are now pinned.
    unpin: undo :func:`pin` (before the memory under it is unmapped).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


def _cudart() -> Any:
    """The CUDA runtime bindings torch ships (cudaHostRegister / cudaHostUnregister)."""
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def _clear_last_error() -> None:
    """Reset the CUDA runtime's last error after a refused call.

    A failed ``cudaHostRegister`` (e.g. 712: the range is already registered in this process) leaves its
    error as the thread's last error, and the next kernel launch's check in torch raises it, far from here.
    torch's bindings lack ``cudaGetLastError``, so it is called in the ``libcudart`` torch has loaded.
    """
    runtime = _cudart()
    getter = getattr(runtime, "cudaGetLastError", None)
    if getter is not None:
        getter()
        return
    for path in _loaded_cudart_paths():
        try:
            ctypes.CDLL(path).cudaGetLastError()
        except (OSError, AttributeError):
            continue
        return
    logger.warning("cannot reset CUDA's last error (no libcudart found in this process)")


def _loaded_cudart_paths() -> list[str]:
    """The libcudart files this process has mapped (torch loads its own)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def cuda_present() -> bool:
    """Whether CUDA is usable in this process."""
    return torch.cuda.is_available()


def pin(memory: torch.Tensor, label: str) -> bool:
    """Register the bytes of ``memory`` (a contiguous CPU tensor) as pinned host memory.

    Returns:
        True when they are pinned now (unpin with :func:`unpin` before they are unmapped); False without
        CUDA, for an empty tensor, or when the driver refuses (logged with ``label``, e.g. the segment name).

    Raises:
        ValueError: ``memory`` is not a contiguous CPU tensor (whether or not CUDA is present).
    """
    if memory.device.type != "cpu" or not memory.is_contiguous():
        raise ValueError(f"pin: only a contiguous CPU tensor can be pinned ({label} is not)")
    if not cuda_present() or memory.numel() == 0:
        return False
    err = int(_cudart().cudaHostRegister(memory.data_ptr(), memory.numel() * memory.element_size(), 0))
    if err != 0:
        logger.warning("cudaHostRegister of %s failed (cudaError %d); it stays pageable", label, err)
        _clear_last_error()
        return False
    logger.debug("pinned %s (%d bytes)", label, memory.numel() * memory.element_size())
    return True


def unpin(memory: torch.Tensor, label: str) -> None:
    """Unregister memory :func:`pin` registered (a failure is logged: the memory is unmapped next anyway)."""
    err = int(_cudart().cudaHostUnregister(memory.data_ptr()))
    if err != 0:
        logger.warning("cudaHostUnregister of %s failed (cudaError %d)", label, err)
