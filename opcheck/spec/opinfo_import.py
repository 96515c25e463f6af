"""`opcheck import-opinfo`: a spec written from an entry of torch's OpInfo database (op_db).

The spec runs the entry's own samples (`opinfo:`) through the checks torch's gradient tests make
(test_ops_gradients.py, test_ops_fwd_gradients.py), with the flags the entry sets:

- `supported_backward_dtypes('cpu')` ∩ {float64, complex128} → `dtypes`, with a cuda skip for
  each of them its cuda backward lacks;
- `check_batched_grad` → `gradcheck.check_batched_grad`;
- `supports_forward_ad` → `gradcheck.check_forward_ad`, or `supports_forward_ad: false` (torch
  asserts that forward AD raises; opcheck's forward_ad_unsupported, that it does not work, so an
  entry's expected failure of that test is not copied);
- `check_batched_forward_grad` → `gradcheck.check_batched_forward_grad`;
- `gradcheck_nondet_tol` → `gradcheck.nondet_tol`;
- `supports_gradgrad` unset → `gradgradcheck.enabled: false` (torch skips the test, unverified);
- `check_batched_gradgrad` → `gradgradcheck.check_batched_grad`;
- `supports_fwgrad_bwgrad` → `gradgradcheck.check_fwd_over_rev`;
- skips and expected failures of those tests (TEST_CHECKS) → `skips` / `expected_failures`: the
  entry's DecorateInfos, and from torch 2.14 on also the `skipOps` rules of torch's gradient test
  files that name it (opcheck.spec.opinfo_skipops.SKIP_OPS_RULES), which op_db no longer holds.

`gradcheck_fast_mode` is not copied: the spec keeps `fast_mode: auto`, which fails wherever the full
check fails within the Jacobian budget and stays bounded beyond it.

The op is the entry's very callable: a path that names it where one does (`torch.sin`,
`torch.Tensor.cdouble`, `torch.nn.functional.relu`), else `opinfo:NAME[:variant]`, which resolves
to the entry's `op` (the lambdas and wrappers written inside op_db).

The YAML is built as data and written by yaml.safe_dump, so no name or reason from op_db can change
its structure; the file is created atomically and never replaces an existing one unless asked.

This module lives in opcheck.spec, beside the format it writes: it authors spec documents (the
same keys, devices and op paths the loader reads back) and renders no model, so it is not code
generation; the CLI only parses arguments and calls it. Finding an entry is opcheck.spec.opinfo_db's
job, shared with the runtime's `opinfo:` samples and the `opinfo:` op path.
"""

from __future__ import annotations

import os
import re
import tempfile
import unittest
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from opcheck.spec import opinfo_db, opinfo_skipops
from opcheck.spec.model import KNOWN_DEVICES
from opcheck.spec.opinfo_db import op_key, opinfo_ref
from opcheck.spec.oppath import OPINFO_PREFIX, resolve_op

__all__ = [
    "ImportedSpec",
    "OpInfoImportError",
    "build_spec",
    "find_entry",
    "import_opinfo",
    "load_op_db",
    "op_key",
    "op_path",
    "opinfo_ref",
    "spec_text",
    "write_spec",
]

GRAD_DTYPES = ("float64", "complex128")
DEVICES = ("cpu", "cuda")
"""The devices OpInfo records dtypes for."""
SAMPLE_NAME = "opinfo"
GRADIENT_TEST_CLASSES = (None, "TestGradients", "TestBwdGradients", "TestFwdGradients")
TEST_CHECKS = {
    "test_fn_grad": "gradcheck",
    "test_fn_gradgrad": "gradgradcheck",
    "test_forward_mode_AD": "forward_ad",
    "test_fn_fwgrad_bwgrad": "fwgrad_bwgrad",
}
"""torch's gradient tests of an op's function variant, by the opcheck check that makes the same call."""
CLASS_CHECKS = {
    "TestFwdGradients": ("forward_ad", "forward_ad_unsupported", "fwgrad_bwgrad"),
    "TestBwdGradients": ("gradcheck", "gradgradcheck"),
}
"""The checks a decoration of a whole test class reaches (test_ops_fwd_gradients.py, test_ops_gradients.py);
a class not listed here (TestGradients, or no class) reaches every check."""
_SAFE_TEXT = re.compile(r"[A-Za-z0-9_.]+\Z")


class OpInfoImportError(ValueError):
    """The entry cannot become a spec; the message says why, on one line."""


@dataclass(frozen=True)
class Decoration:
    """A skip or expected failure that one DecorateInfo puts on torch's gradient tests."""

    kind: str  # "skip" | "xfail"
    cls_name: str | None
    test_name: str | None
    devices: tuple[str, ...] | None  # None: every device
    dtypes: tuple[str, ...] | None  # None: every dtype
    why: str
    source: str | None = None  # the test file that states it; None: the entry in op_db


def load_op_db() -> tuple[Any, ...]:
    try:
        return opinfo_db.load_op_db()
    except opinfo_db.OpInfoUnavailable as e:
        raise OpInfoImportError(str(e)) from None


def find_entry(ref: str, db: Iterable[Any]) -> Any:
    """The entry `ref` names (`name`, `name.variant` or `name:variant`); did-you-mean otherwise."""
    try:
        return opinfo_db.find_entry(ref, db, dotted=True)
    except opinfo_db.UnknownOpInfo as e:
        raise OpInfoImportError(str(e)) from None


def spec_name(info: Any, db: Iterable[Any] = ()) -> str:
    """A spec name (`[a-z][a-z0-9_]*`) from the entry's key: `nn.functional.relu` → `nn_functional_relu`.

    Where another entry of `db` comes to the same name, the entry whose key the name changed more
    says how: `__rsub__` beside `rsub` is `rsub_dunder`, `T` beside `t` is `t_upper` (one spec
    file, test module and test id per entry).
    """
    key = op_key(info)
    name = _base_name(key)
    if not any(_base_name(k) == name and k != key for k in (op_key(e) for e in db)):
        return name
    return (
        name
        + ("_dunder" if key.startswith("__") and key.endswith("__") else "")
        + ("_upper" if key != key.lower() else "")
    )


def _base_name(key: str) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", key.lower()).strip("_")
    return name if re.match(r"[a-z]", name) else f"op_{name}"


def op_path(info: Any) -> str:
    """A path opcheck's resolver turns back into the entry's very callable.

    A path that names it, where one does; `opinfo:NAME[:variant]` for ops that only op_db holds.
    """
    op = info.op
    candidates = [f"torch.{info.name}", f"torch.{info.aten_name}"] if info.aten_name else [f"torch.{info.name}"]
    module, qualname = getattr(op, "__module__", None), getattr(op, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        candidates.append(f"{module}.{qualname}")
        candidates.append(f"{module}:{qualname}")
    if type(op).__name__ in ("OpOverload", "OpOverloadPacket"):
        candidates.append(f"torch.ops.{op}")
    candidates.append(f"torch.Tensor.{info.name}")  # entries whose op is a Tensor method: cdouble, __radd__
    candidates.append(f"{OPINFO_PREFIX}{opinfo_ref(info)}")
    for candidate in candidates:
        try:
            found = resolve_op(candidate)
        except Exception:  # noqa: BLE001 - a candidate that does not resolve is just not the path
            continue
        if found is op:
            return candidate
    what = getattr(op, "__qualname__", None) or type(op).__name__
    raise OpInfoImportError(
        f"OpInfo {op_key(info)!r} calls {what!r}, which no op path names "
        f"(tried {', '.join(dict.fromkeys(candidates))}); "
        "write its spec by hand with a `generator:` sample"
    )


def grad_dtypes(info: Any, device: str) -> list[str]:
    supported = {str(d).removeprefix("torch.") for d in info.supported_backward_dtypes(device)}
    return [d for d in GRAD_DTYPES if d in supported]


def decorations(info: Any, *, torch_version: str | None = None) -> list[Decoration]:
    """The skips and expected failures torch's gradient tests put on the entry: its own, in op_db's
    order, then the test files' `skipOps` rules that name it, for the torch of `torch_version`
    (default: the installed one)."""
    found: list[Decoration] = []
    for item in (*info.skips, *info.decorators):
        if hasattr(item, "decorators"):  # a DecorateInfo
            cls_name, test_name = item.cls_name, item.test_name
            device_type, dtypes, decorators = item.device_type, item.dtypes, item.decorators
            if not _active(item.active_if):
                continue
        else:  # a bare decorator applies to every test
            cls_name = test_name = device_type = dtypes = None
            decorators = [item]
        if cls_name not in GRADIENT_TEST_CLASSES or (test_name is not None and test_name not in TEST_CHECKS):
            continue
        names = None if dtypes is None else tuple(str(d).removeprefix("torch.") for d in dtypes)
        for decorator in decorators:
            kind, why = _kind(decorator)
            if kind is not None:
                found.append(Decoration(kind, cls_name, test_name, _devices(device_type), names, why))
    for source, cls_name, test_name, rule in opinfo_skipops.skip_ops_rules(info, torch_version):
        why = "Skipped!" if rule.kind == "skip" else ""  # skipOps skips with unittest.skip("Skipped!")
        found.append(Decoration(rule.kind, cls_name, test_name, None, rule.dtypes, why, source))
    return found


def _devices(device_type: Any) -> tuple[str, ...] | None:
    """A DecorateInfo's devices: it takes one device type or, from torch 2.14 on, a list of them."""
    if device_type is None:
        return None
    if isinstance(device_type, str):
        return (device_type,)
    return tuple(str(d) for d in device_type)


def _active(active_if: Any) -> bool:
    if callable(active_if):
        try:
            return bool(active_if({}))
        except Exception:  # noqa: BLE001 - a condition on test parameters we do not have: keep it
            return True
    return bool(active_if)


def _kind(decorator: Any) -> tuple[str | None, str]:
    """("skip", reason), ("xfail", "") or (None, "") for decorators that neither skip nor xfail."""
    if decorator is unittest.expectedFailure:
        return "xfail", ""

    def probe() -> None:
        pass

    try:
        decorated = decorator(probe)
    except Exception:  # noqa: BLE001 - a decorator that needs a real test is not a skip
        return None, ""
    if getattr(decorated, "__unittest_expecting_failure__", False):
        return "xfail", ""
    if getattr(decorated, "__unittest_skip__", False):
        return "skip", str(getattr(decorated, "__unittest_skip_why__", "") or "")
    return None, ""


def checks_of(spec: dict[str, Any]) -> list[str]:
    """The checks the spec generates (OpSpec.checks for the keys this module writes)."""
    gc, ggc = spec.get("gradcheck", {}), spec.get("gradgradcheck", {})
    fwd = spec.get("supports_forward_ad", True)
    out = ["gradcheck", "forward_ad" if gc.get("check_forward_ad") else None]
    out.append(None if fwd else "forward_ad_unsupported")
    if ggc.get("enabled", True):
        out += ["gradgradcheck", "fwgrad_bwgrad" if ggc.get("check_fwd_over_rev") else None]
    return [c for c in out if c]


def rules_from(decos: Iterable[Decoration], spec: dict[str, Any], key: str) -> dict[str, list[dict[str, Any]]]:
    """`skips` and `expected_failures` rules for the decorations that reach a check the spec generates."""
    checks = checks_of(spec)
    dtypes = spec["dtypes"]
    out: dict[str, list[dict[str, Any]]] = {"skips": [], "expected_failures": []}
    seen: set[tuple[Any, ...]] = set()
    for d in decos:
        devices = None if d.devices is None else [t for t in d.devices if t in KNOWN_DEVICES]
        if devices == []:
            continue
        where: dict[str, Any] = {}
        if d.test_name is None:
            where_checks = [c for c in checks if c in CLASS_CHECKS.get(d.cls_name or "", checks)]
            if d.kind == "xfail" and "forward_ad_unsupported" in where_checks:
                where_checks.remove("forward_ad_unsupported")  # as below: torch's xfail there does not carry over
        else:
            check = TEST_CHECKS[d.test_name]
            if check == "forward_ad" and not spec.get("supports_forward_ad", True):
                if d.kind == "xfail":
                    # torch's test asserts that forward AD raises, and its xfail says it does not;
                    # forward_ad_unsupported also passes on no tangent or a wrong one, so the
                    # expectation does not carry over (the check fails only if forward AD works).
                    continue
                check = "forward_ad_unsupported"
            where_checks = [check] if check in checks else []
        if not where_checks:
            continue
        where["check"] = where_checks[0] if len(where_checks) == 1 else where_checks
        if devices is not None:
            where["device"] = devices[0] if len(devices) == 1 else devices
        if d.dtypes is not None:
            matched = [t for t in dtypes if t in d.dtypes]
            if not matched:
                continue
            where["dtype"] = matched[0] if len(matched) == 1 else matched
        rule_key = "skips" if d.kind == "skip" else "expected_failures"
        identity = (rule_key, repr(sorted(where.items())))
        if identity in seen:
            continue
        seen.add(identity)
        test = f"{d.cls_name or 'every test class'}.{d.test_name or 'every test'}"
        done = "skips" if d.kind == "skip" else "expects to fail"
        if d.source:
            reason = f"torch's {d.source} {done} {test} for OpInfo {key}"
        else:
            reason = f"torch's OpInfo {key} {done} {test}"
        if d.why:
            reason += f": {d.why}"
        out[rule_key].append({"where": where, "reason": reason})
    return out


def build_spec(info: Any, db: Iterable[Any] = (), *, torch_version: str | None = None) -> dict[str, Any]:
    """The spec for one entry, as the mapping the YAML file holds (keys in FORMAT.md's order);
    `db`: the entries its name must differ from; `torch_version`: the torch whose gradient tests'
    rules it takes (default: the installed one)."""
    key = op_key(info)
    if not info.supports_autograd:
        raise OpInfoImportError(f"OpInfo {key!r} does not support autograd (supports_autograd=False): nothing to check")
    dtypes = grad_dtypes(info, "cpu")
    if not dtypes:
        raise OpInfoImportError(f"OpInfo {key!r} has no float64 or complex128 backward on cpu: nothing to gradcheck")
    spec: dict[str, Any] = {
        "op": op_path(info),
        "name": spec_name(info, db),
        "dtypes": dtypes,
        "devices": list(DEVICES),
        "samples": [{"name": SAMPLE_NAME, "opinfo": opinfo_ref(info)}],
    }
    fwd = bool(info.supports_forward_ad)
    gradcheck: dict[str, Any] = {"check_batched_grad": bool(info.check_batched_grad), "check_forward_ad": fwd}
    if fwd:
        gradcheck["check_batched_forward_grad"] = bool(info.check_batched_forward_grad)
    if info.gradcheck_nondet_tol:
        gradcheck["nondet_tol"] = float(info.gradcheck_nondet_tol)
    spec["gradcheck"] = gradcheck
    if info.supports_gradgrad:
        spec["gradgradcheck"] = {
            "check_batched_grad": bool(info.check_batched_gradgrad),
            "check_fwd_over_rev": bool(info.supports_fwgrad_bwgrad) and fwd,
        }
    else:
        spec["gradgradcheck"] = {"enabled": False}
    if not fwd:
        spec["supports_forward_ad"] = False
    cuda = grad_dtypes(info, "cuda")
    skips = [
        {"where": {"device": "cuda", "dtype": t}, "reason": f"torch's OpInfo {key} has no {t} backward on cuda"}
        for t in dtypes
        if t not in cuda
    ]
    rules = rules_from(decorations(info, torch_version=torch_version), spec, key)
    if skips or rules["skips"]:
        spec["skips"] = skips + rules["skips"]
    if rules["expected_failures"]:
        spec["expected_failures"] = rules["expected_failures"]
    return spec


def spec_text(spec: dict[str, Any], key: str, *, schema: str | None = None) -> str:
    """The YAML file: a comment header, then the mapping as yaml.safe_dump writes it."""
    header = []
    if schema is not None and _SAFE_TEXT.match(schema.replace("/", "")):
        header.append(f"# yaml-language-server: $schema={schema}")
    source = f" {key}" if _SAFE_TEXT.match(key) else ""
    header.append(f"# From torch's OpInfo{source} (torch.testing._internal.common_methods_invocations.op_db),")
    header.append("# written by `opcheck import-opinfo`: its samples, gradient flags, skips and expected failures.")
    body = yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, allow_unicode=True, width=100)
    return "\n".join(header) + "\n" + body


def write_spec(path: Path, text: str, *, force: bool = False) -> None:
    """Write `text` to `path` atomically; an existing file is replaced only with `force`."""
    if os.path.lexists(path) and not force:
        raise OpInfoImportError(f"{path} already exists; pass --force to overwrite it")
    if os.path.isdir(path):
        raise OpInfoImportError(f"{path} is a folder, not a spec file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        if force:
            os.replace(tmp, path)
        else:
            try:  # a link fails if the path appeared meanwhile, where a rename would replace it
                os.link(tmp, path)
            except FileExistsError:
                raise OpInfoImportError(f"{path} already exists; pass --force to overwrite it") from None
            except OSError:  # a file system without hard links
                if os.path.lexists(path):
                    raise OpInfoImportError(f"{path} already exists; pass --force to overwrite it") from None
                os.replace(tmp, path)
    except OSError as e:
        raise OpInfoImportError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp.exists():
            tmp.unlink()


@dataclass(frozen=True)
class ImportedSpec:
    """An entry's spec, ready to write."""

    key: str  # the entry, as `name` or `name.variant`
    spec: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    def text(self, *, schema: str | None = None) -> str:
        return spec_text(self.spec, self.key, schema=schema)


def import_opinfo(ref: str, db: Iterable[Any] | None = None) -> ImportedSpec:
    """The spec for the entry `ref` names (`name`, `name.variant` or `name:variant`); `db` defaults to op_db."""
    entries = list(load_op_db() if db is None else db)
    info = find_entry(ref, entries)
    return ImportedSpec(op_key(info), build_spec(info, entries))
