"""The catalog's Triton kernels (examples/triton_kernels.py): each forward and backward against its
float64 reference, the in-place cross-entropy, the generated Triton suites catching a broken kernel
(that they pass is tests/test_catalog.py's run of generated_tests), the kernels compiling for a GPU
where there is none, and README's "Test a Triton kernel" steps as written. Without a GPU the kernels
run under Triton's interpreter."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: the `triton` extra installs it on Linux x86_64")

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from examples import triton_kernels as tk  # noqa: E402
from opcheck.config import tomllib  # noqa: E402
from tests import forked_python  # noqa: E402
from tests.test_readme import blocks, section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The interpreter runs CPU tensors, compiled kernels GPU tensors (the module's docstring).
DEVICE = "cpu" if isinstance(tk._rounded, InterpretedFunction) else "cuda"
# Float32 kernels against float64 on the same values: a few float32 roundings, nowhere near a bug.
TIGHT = {"rtol": 1e-5, "atol": 1e-6}


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("OPCHECK_", "PYTEST_"))}


def pytest_run(args: list[str], cwd: Path, fresh: bool = False) -> subprocess.CompletedProcess:
    """pytest on generated modules: interpreted on CPU here, compiled on the GPU where there is one.
    Unless `fresh`, pytest is forked with torch imported (tests/forked_python.py): the generated
    tests run in the fresh process its supervisor starts."""
    device = [] if DEVICE == "cpu" else ["--opcheck-device", "cuda"]
    args = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args, *device]
    if not fresh:
        return forked_python.run("pytest", *args, cwd=cwd, env=env(), timeout=600)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=cwd, env=env(), capture_output=True, text=True, timeout=600
    )


def summary(done: subprocess.CompletedProcess) -> str:
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else done.stderr


def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]


def check_against_reference(op, reference, args: list[torch.Tensor], kwargs=None) -> None:
    """op on float32 `args` and reference on their float64 copies: outputs and every input's gradient."""
    kwargs = kwargs or {}
    low = leaves(*(a.to(DEVICE) for a in args))
    high = leaves(*(a.double() if a.is_floating_point() else a for a in low))
    out, ref = op(*low, **kwargs), reference(*high, **kwargs)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, **TIGHT)
    cotangent = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grads = torch.autograd.grad(out, [t for t in low if t.requires_grad], cotangent.float())
    expected = torch.autograd.grad(ref, [t for t in high if t.requires_grad], cotangent)
    for i, (grad, want) in enumerate(zip(grads, expected)):
        assert grad.dtype == torch.float32, i
        torch.testing.assert_close(grad.double(), want, **TIGHT, msg=lambda m, i=i: f"gradient of input {i}: {m}")


# ------------------------------------------------------------------------------------ kernels
def test_rms_norm_matches_its_reference_on_a_tail_block():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 1000, generator=gen) * 2
    weight = torch.rand(1000, generator=gen) + 0.5
    check_against_reference(tk.rms_norm, tk.rms_norm_reference, [x, weight], {"eps": 1e-5})


def test_swiglu_matches_its_reference_on_a_tail_block():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 1000, generator=gen) * 4
    b = torch.randn(5, 1000, generator=gen)
    check_against_reference(tk.swiglu, tk.swiglu_reference, [a, b])


def test_cross_entropy_matches_its_reference_on_a_tail_block():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=gen) * 3
    targets = torch.randint(0, 1000, (5,), generator=gen)
    check_against_reference(tk.cross_entropy, tk.cross_entropy_reference, [logits, targets])


def test_cross_entropy_stays_finite_where_exp_of_the_logits_overflows():
    gen = torch.Generator().manual_seed(0)
    logits = torch.rand(3, 300, generator=gen) * 20 + 90  # exp(90) > float32's largest
    targets = torch.randint(0, 300, (3,), generator=gen)
    check_against_reference(tk.cross_entropy, tk.cross_entropy_reference, [logits, targets])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_results_are_the_float32_results_rounded_once(dtype):
    """float32 inside, one rounding at the store: the float16/bfloat16 outputs are the exact
    results rounded to nearest (even), which the interpreter's bfloat16 cast alone would not give."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 1000, generator=gen) * 2).to(dtype)
    weight = (torch.rand(1000, generator=gen) + 0.5).to(dtype)
    a, b = (torch.randn(4, 1000, generator=gen) * 4).to(dtype), torch.randn(4, 1000, generator=gen).to(dtype)
    got = [tk.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-5), tk.swiglu(a.to(DEVICE), b.to(DEVICE))]
    exact = [tk.rms_norm_reference(x.double(), weight.double(), 1e-5), tk.swiglu_reference(a.double(), b.double())]
    for out, ref in zip(got, exact):
        assert out.dtype == dtype
        # ties and float32's own error may flip a rare last bit; a truncating store flips half
        assert (out.cpu() == ref.to(dtype)).float().mean() > 0.999


# ------------------------------------------------------------------------------------ in place
def test_cross_entropy_inplace_writes_the_gradient_into_its_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1000, generator=gen) * 3
    targets = torch.randint(0, 1000, (6,), generator=gen).to(DEVICE)
    ref_logits = logits.double().to(DEVICE).requires_grad_()
    ref_loss = tk.cross_entropy_reference(ref_logits, targets)
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_logits)

    fresh = logits.clone().to(DEVICE).requires_grad_()
    loss = tk.cross_entropy_inplace(fresh, targets)
    torch.testing.assert_close(loss.double(), ref_loss.detach(), **TIGHT)
    # the forward overwrote the logits, by value, behind autograd's back
    torch.testing.assert_close(fresh.detach().double(), ref_grad, **TIGHT)
    assert fresh._version == 0
    # backward scales that memory by the loss's gradient and returns it
    loss.backward(torch.tensor(2.5, device=DEVICE))
    torch.testing.assert_close(fresh.grad.double(), 2.5 * ref_grad, **TIGHT)
    torch.testing.assert_close(fresh.detach().double(), 2.5 * ref_grad, **TIGHT)


def test_cross_entropy_inplace_refuses_logits_it_cannot_write_in_place():
    logits = torch.randn(1000, 4, device=DEVICE).t()
    with pytest.raises(ValueError, match="must be contiguous"):
        tk.cross_entropy_inplace(logits, torch.zeros(4, dtype=torch.int64, device=DEVICE))


def _inplace_spec(clone_inputs: bool):
    from opcheck.spec import load_spec_text

    text = (REPO / "op_specs" / "triton_cross_entropy_inplace.yaml").read_text(encoding="utf-8")
    assert text.count("\nclone_inputs: true") == 1
    if not clone_inputs:
        text = text.replace("\nclone_inputs: true", "\nclone_inputs: false")
    (spec,) = load_spec_text(text, source="op_specs/triton_cross_entropy_inplace.yaml")
    return spec


def test_the_in_place_kernel_passes_with_clone_inputs_and_fails_naming_the_input_without():
    from opcheck.runtime import LowPrecisionMismatch, run_check

    run_check(_inplace_spec(True), "lowprec", DEVICE, "float32", "tail_1000")
    with pytest.raises(LowPrecisionMismatch) as info:
        run_check(_inplace_spec(False), "lowprec", DEVICE, "float32", "tail_1000")
    text = str(info.value)
    assert "the op wrote into an input" in text.splitlines()[0]
    assert "the op wrote into its input 0 (Tensor[4, 1000] float32): 4000 of 4000 entries changed" in text
    assert "clone_inputs: true" in text


# ------------------------------------------------------------------------------------ generated suites
@pytest.mark.parametrize(
    "name, broken, mutant, message",
    [
        # the classic tail bug: masked lanes read as 0, so exp(0 - max) joins every row's sum
        (
            "triton_cross_entropy",
            'x = tl.load(row_ptr + cols, mask=mask, other=-float("inf"))',
            "x = tl.load(row_ptr + cols, mask=mask, other=0.0)",
            "output 0 differs",
        ),
        # a backward that forgets the derivative of σ: da = dout b σ(a)
        (
            "triton_swiglu",
            "da = dout * b * sig * (1.0 + a * (1.0 - sig))",
            "da = dout * b * sig",
            "VJP: gradient of input 0 differs",
        ),
    ],
    ids=["cross_entropy_tail", "swiglu_backward"],
)
def test_a_broken_kernel_fails_its_generated_suite(tmp_path, name, broken, mutant, message):
    for folder in ("examples", "op_specs"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "generated_tests").mkdir()
    shutil.copy(REPO / "generated_tests" / f"test_{name}.py", tmp_path / "generated_tests")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    kernels = tmp_path / "examples" / "triton_kernels.py"
    source = kernels.read_text(encoding="utf-8")
    assert source.count(broken) >= 1, broken  # every kernel that loads the row that way
    kernels.write_text(source.replace(broken, mutant), encoding="utf-8")

    done = pytest_run([f"generated_tests/test_{name}.py", "-k", "float32"], tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert re.search(r"\d+ failed", summary(done)), summary(done)
    assert f"FAILED generated_tests/test_{name}.py::test_lowprec[{DEVICE}-float32-tail_1000]" in done.stdout
    assert message in done.stdout, done.stdout[-3000:]


# ------------------------------------------------------------------------------------ with a GPU
COMPILE = textwrap.dedent(
    """
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from examples import triton_kernels as tk

    try:
        tk.swiglu(torch.ones(2, 3), torch.ones(2, 3))
    except RuntimeError as e:
        print("cpu:", e)
    pointers = {"TARGETS": "*i64", "RSTD": "*fp32", "DW_PARTIAL": "*fp32", "LOSS": "*fp32"}
    kernels = [v for k, v in vars(tk).items() if k.endswith("_kernel")]
    for kernel in kernels:
        for dtype in ("fp32", "fp16", "bf16"):
            signature, constants = {}, {}
            for name in kernel.arg_names:
                if name == "BLOCK_SIZE" or name == "WRITE_GRAD":
                    signature[name] = "constexpr"
                    constants[name] = 1024 if name == "BLOCK_SIZE" else True
                elif name.isupper():
                    signature[name] = pointers.get(name, f"*{dtype}")
                else:
                    signature[name] = "fp32" if name == "eps" else "i32"
            compiled = triton.compile(ASTSource(kernel, signature, constants), target=GPUTarget("cuda", 90, 32))
            assert compiled.asm["cubin"], kernel
    print("compiled:", len(kernels), "kernels x 3 dtypes")
    """
)


def test_with_the_interpreter_off_kernels_compile_for_a_gpu_and_refuse_cpu_tensors():
    """What a GPU machine does (TRITON_INTERPRET unset): kernels compiled for the GPU, here for
    sm_90 without one (triton's code generator and its bundled ptxas), and CPU tensors refused
    with the way out, not triton's "Pointer argument cannot be accessed"."""
    done = subprocess.run(
        [sys.executable, "-c", COMPILE],
        cwd=REPO,
        env=dict(env(), TRITON_INTERPRET="0", PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "compiled: 7 kernels x 3 dtypes" in done.stdout, done.stdout
    if not torch.cuda.is_available():
        cpu = next(line for line in done.stdout.splitlines() if line.startswith("cpu:"))
        assert "compiles its Triton kernels for the GPU" in cpu and "TRITON_INTERPRET=1" in cpu, cpu


# ------------------------------------------------------------------------------------ README
def run_line(line: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(line)
    if argv[0] == "opcheck":
        argv = [sys.executable, "-m", "opcheck", *argv[1:]]
    elif argv[:3] == ["python", "-m", "pytest"]:
        return pytest_run(argv[3:], cwd, fresh=True)  # as written: a fresh interpreter
    else:
        raise AssertionError(f"README step runs something this test does not know: {line!r}")
    return subprocess.run(argv, cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)


@pytest.mark.long
def test_readme_triton_steps_work_as_written(tmp_path):
    text = section("Test a Triton kernel")
    flat = " ".join(text.split())
    (_, install), (lang, spec), (_, steps) = blocks(text)
    assert lang == "yaml"

    # 1. the install is Set up's, and its suite brings triton where triton has wheels
    (install,) = install.strip().splitlines()
    assert install == "pip install torch==2.13.0 -e '.[suite]'"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert "opcheck[triton]" in extras["suite"] and "opcheck[suite]" in extras["test"]
    (requirement,) = extras["triton"]
    assert requirement.startswith("triton>=") and "platform_system == 'Linux'" in requirement

    # 2. a folder of one's own with a copy of the example kernels
    kernel_file = re.search(r"copy it to `([\w/]+\.py)` there", flat).group(1)
    (tmp_path / kernel_file).parent.mkdir(parents=True)
    shutil.copy(REPO / "examples" / "triton_kernels.py", tmp_path / kernel_file)

    # 3. the scaffold, then the spec as README writes it
    path = re.search(r"^3\. Write `(op_specs/\w+\.yaml)`", text, re.M).group(1)
    scaffold = re.search(r"\(`(opcheck new [^`]+)`", flat).group(1)
    made = run_line(scaffold, tmp_path)
    assert made.returncode == 0 and (tmp_path / path).is_file(), made.stdout + made.stderr
    (tmp_path / path).write_text(spec, encoding="utf-8")

    # 4. generate and run: green
    generate, run = steps.strip().splitlines()
    generated = run_line(generate, tmp_path)
    assert generated.returncode == 0 and generated.stdout.startswith("1 written,"), generated.stdout + generated.stderr
    assert run.endswith(f"generated_tests/test_{Path(path).stem}.py")
    ran = run_line(run, tmp_path)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    assert re.match(r"\d+ passed", summary(ran).strip("= ")) and "failed" not in summary(ran), summary(ran)
