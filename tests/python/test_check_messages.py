"""The torch layer's error messages stream only strings: a number streamed through std::ostream
(c10::str, which TORCH_CHECK uses) from this library crashed the process with SIGSEGV on the GPU
machine (GCC 13 against the torch 2.11 wheel; see src/torch/common.cpp), where a clear error
was due. That crash cannot happen on a CPU-only CI machine, so this scans the sources: every
argument of a TORCH_CHECK* message must be a string literal or an expression known to give a
string (std::to_string, dims_str, a dtype, a name)."""

import pathlib
import re

SOURCES = sorted((pathlib.Path(__file__).parents[2] / "src" / "torch").glob("*.[ch]*"))

# Arguments that are strings: formatting helpers, dtypes (printed inside c10 itself) and the
# string-typed names the sources pass.
STRING_ARGUMENT = re.compile(
    r"""(std::to_string|std::string|dims?_str|device_str|cudaGetErrorString)\(.*\)
    | [\w>.-]+(\.|->)scalar_type\(\)
    | (kOp|op|name|x_name|q_name|read_name|prop->name|error|lacks|alternative|type|out_dtype|reduction
       |expected\(\)|schema\.operator_name\(\))""",
    re.VERBOSE,
)


def split_top_level(body):
    """The comma-separated arguments of a macro call's body (string literals and brackets kept)."""
    parts, current, depth, i = [], "", 0, 0
    while i < len(body):
        c = body[i]
        if c == '"':
            end = i + 1
            while body[end] != '"':
                end += 2 if body[end] == "\\" else 1
            current += body[i : end + 1]
            i = end + 1
            continue
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += c
        i += 1
    return parts + [current.strip()]


def check_calls(text):
    """(condition, message arguments) of each TORCH_CHECK* call in ``text``."""
    for match in re.finditer(r"\bTORCH_CHECK\w*\(", text):
        depth, j = 1, match.end()
        while depth:
            if text[j] == '"':
                j += 1
                while text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
            depth += text[j] == "("
            depth -= text[j] == ")"
            j += 1
        condition, *message = split_top_level(text[match.end() : j - 1])
        yield condition, message


def test_sources_are_found():
    assert len(SOURCES) > 5
    assert sum(len(list(check_calls(p.read_text()))) for p in SOURCES) > 50


def test_messages_stream_no_numbers():
    offending = []
    for path in SOURCES:
        for condition, message in check_calls(path.read_text()):
            for argument in message:
                argument = " ".join(argument.split())
                if not argument.startswith('"') and not STRING_ARGUMENT.fullmatch(argument):
                    offending.append(f"{path.name}: {argument}  (in the check of {condition[:60]})")
    assert not offending, "format these with std::to_string (or a helper of common.cpp):\n" + "\n".join(offending)


def test_the_scan_catches_a_streamed_number():
    text = 'TORCH_CHECK_VALUE(n > 0, kOp, ": got ", weight.size(0), " rows, ", std::to_string(n));'
    (_, message), = check_calls(text)
    assert [a for a in message if not a.startswith('"') and not STRING_ARGUMENT.fullmatch(a)] == ["weight.size(0)"]
