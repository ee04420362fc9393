"""On a CPU-only machine the compat finder lets SGLang import, and the kernel stub refuses to run.
Each check runs in a fresh interpreter: the finder acts on the first import of SGLang, which this
test process made long ago."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_torchvision_and_sgl_kernel_import_and_stub_raises() -> None:
    result = run_python(
        """
        import torchvision, sgl_kernel
        from sgl_blend.cpu_compat import KernelUnavailableError, kernel_stub_active
        assert kernel_stub_active()
        try:
            sgl_kernel.copy_all_layer_kv_cache_cpu(1, 2)
        except KernelUnavailableError as error:
            print("raised:", error)
        from sgl_kernel.scalar_type import scalar_types
        print("constant:", scalar_types.uint4b8)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "raised: sgl_kernel.copy_all_layer_kv_cache_cpu was called" in result.stdout
    assert "constant: <sgl-blend stub sgl_kernel.scalar_type.scalar_types.uint4b8>" in result.stdout


def test_sglang_server_module_imports() -> None:
    result = run_python("import sglang.srt.entrypoints.http_server; print('ok')")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
