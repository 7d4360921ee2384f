"""What a failed candidate says, as a user reads it, and what to do about it.

A builder's or a phone's error reaches the farm wrapped: MetaSchedule's "RPCRunner: An
exception occurred", a Python traceback, TVM's "Error caught from RPC call" and the phone's
own C++ frames. `brief` keeps the lines that say what went wrong; `fix_for` names the next
step for the failure classes of workers/metaschedule/runner.py's `classify_run_error`.
"""

from __future__ import annotations

import re

_NOISE = re.compile(
    r"^(RPCRunner: An exception occurred|LocalRunner: An exception occurred|Traceback \(most "
    r"recent call last\):|During handling of the above exception.*|The above exception was the "
    r"direct cause.*|\s*File \".*\", line \d+.*|\s*[~^]+\s*|\s*\d+: .*|\s*at .*\.(cc|h):\d+.*|"
    r"Error caught from RPC call:\s*|\[bt\].*|Stack trace:.*|\s*)$")


def brief(text: str, limit: int = 300) -> str:
    """`text` (an error message with whatever wraps it) on one line of at most `limit`
    characters: tracebacks, frames and wrappers dropped, the last lines that carry a
    message kept (the phone's own words come last)."""
    lines = [ln.rstrip() for ln in str(text).splitlines()]
    kept: list[str] = []
    skip_code = False
    for ln in lines:
        if skip_code and ln.startswith("    "):  # the source line under a traceback frame
            skip_code = False
            continue
        skip_code = bool(re.match(r"\s*File \".*\", line \d+", ln))
        if not _NOISE.match(ln):
            kept.append(ln.strip())
    if not kept:
        return (lines[-1].strip() if lines else "")[:limit]
    out = kept[-1]
    for ln in reversed(kept[:-1]):  # earlier lines while they fit: context for the last
        if ln in out or len(out) + len(ln) + 3 > limit:
            break
        out = f"{ln} | {out}"
    return out[-limit:] if len(out) > limit else out


def fix_for(error_class: str, text: str = "", key: str = "KEY", tracker: str = "HOST:PORT") -> str:
    """The next step for a failure of `error_class` whose brief text is `text`."""
    low = text.lower()
    doctor = f"farm doctor --tracker {tracker} --device-key {key}"
    if "random_fill" in low or "unable to find function" in low:
        return (f"the phone's TVM runtime lacks a function the farm called: build its RPC "
                f"server from apache-tvm 0.27 (README: real phones), then `{doctor}`")
    if "loader of that name is not registered" in low or "no opencl platform" in low:
        return ("the phone has no OpenCL: its TVM RPC app or server must be built with TVM's "
                "OpenCL runtime, and the phone needs an OpenCL platform (README: phone GPUs; "
                f"`{doctor}`)")
    if "cl_invalid_work_group_size" in low or "cl_out_of_resources" in low:
        return (f"kernels over the phone GPU's limits (threads or local memory a work-group): "
                f"`{doctor}` compares the profile's limits with the phone's; lower them in the "
                f"profile or leave them out to take the phone's")
    if "opencl build error" in low or "cl_build_program_failure" in low:
        return ("the phone's OpenCL compiler refused a kernel (its build log is above): such "
                "candidates are invalid, the job tunes on with the others; if every one fails, "
                "the profile's target (device, limits) does not fit the phone's GPU")
    if any(s in low for s in ("cannot open shared object", "wrong elf class", "exec format",
                              "dlopen", "undefined symbol", "no such file")):
        return (f"the phone cannot load the library built for it: the profile's target triple "
                f"or compiler does not fit the phone (`{doctor}` checks both)")
    if error_class == "build":
        return f"building candidates failed on the worker host: check the profile's compiler (`{doctor}`)"
    if error_class == "timeout":
        return "candidates ran past the phone's deadline: raise run_timeout_s, or check the phone is not throttled"
    if error_class == "wrong_answer":
        return ("candidates computed other values than the unscheduled kernel on the phone: "
                "check the profile's target fits the phone (mattr, mcpu)")
    if error_class in ("device_lost", "culprit"):
        return (f"the phones crashed or went away while running candidates: see the phones' "
                f"logs; a target naming instructions the phone lacks crashes it (`{doctor}`)")
    return f"`{doctor}` sends one candidate through the whole path and shows the phone's own error"
