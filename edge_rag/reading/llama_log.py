"""llama.cpp's log, through a Python callback: what reaches stderr, and Ctrl-C while it runs.

llama.cpp calls the callback for every line it logs (a model load logs hundreds). Python runs a signal's handler at
the next line of Python the main thread runs, which is then most often this callback's, and ctypes swallows what a
callback raises ("Exception ignored on calling ctypes callback function", printed to the stderr llama-cpp-python
silences while it loads): Ctrl-C while the generator loaded was lost, and ``edge-rag ask`` ran on to its end (6 of 8
interrupts sent while a model loaded). ``interrupts_after`` holds such a signal and delivers it after the call.
"""
from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

GGML_LOG_ERROR, GGML_LOG_CONT = 4, 5  # ggml_log_level of the llama.cpp that llama-cpp-python 0.3.36 builds
_log_callback = None  # the ctypes callback llama.cpp holds: it must outlive every model
_last_log_level = 0


def errors_only() -> None:
    """Let only llama.cpp's errors through to stderr. llama-cpp-python's own filter reads ggml's log levels one
    off (a WARN passes as an ERROR), so its ``verbose=False`` let a KV-cache notice into the demo's output."""
    global _log_callback
    import llama_cpp

    if _log_callback is None:
        @llama_cpp.llama_log_callback
        def errors_only(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            global _last_log_level
            _last_log_level = _last_log_level if level == GGML_LOG_CONT else level
            if _last_log_level >= GGML_LOG_ERROR:
                sys.stderr.write(text.decode("utf-8", "replace"))

        _log_callback = errors_only
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def interrupts_after() -> Iterator[None]:
    """SIGINT during the block goes to its handler once the block is done (in the main thread, where Python runs
    signal handlers; elsewhere, and for a handler that is not Python's, nothing changes)."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(handler):
        yield
        return
    held: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
    if held:
        handler(*held[0])
