"""The security review of docs/security.md, checked: no unpickling, no shell, remote code off unless
asked for, only safetensors weights from the hub, and an API key that never reaches an output file."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from babelprobe import models
from babelprobe.cli import build_parser, main

PACKAGE = Path(models.__file__).parent
SOURCES = sorted(PACKAGE.rglob("*.py"))

FORBIDDEN = {
    "unpickling": re.compile(r"\bpickle\.loads?\(|\bread_pickle\(|allow_pickle\s*=\s*True|\bjoblib\.load\("),
    "torch.load without weights_only=True": re.compile(r"torch\.load\((?![^)]*weights_only\s*=\s*True)"),
    "a shell": re.compile(r"shell\s*=\s*True|\bos\.system\(|\bos\.popen\(|\bsubprocess\."),
    "eval/exec of text": re.compile(r"(?<![\w.])(eval|exec)\("),
    "remote code on by default": re.compile(r"trust_remote_code\s*=\s*True"),
}


CAUGHT = {"unpickling": "data = pickle.load(f)", "torch.load without weights_only=True": "torch.load(path)",
          "a shell": "subprocess.run(cmd, shell=True)", "eval/exec of text": "value = eval(text)",
          "remote code on by default": "AutoModel.from_pretrained(p, trust_remote_code=True)"}


def test_the_checks_below_would_catch_a_bad_line():
    for problem, line in CAUGHT.items():
        assert FORBIDDEN[problem].search(line), problem
    assert not FORBIDDEN["torch.load without weights_only=True"].search("torch.load(p, weights_only=True)")
    assert not FORBIDDEN["eval/exec of text"].search("model.eval()")


@pytest.mark.parametrize("problem", FORBIDDEN)
def test_the_package_source_has_none_of(problem):
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in SOURCES
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if FORBIDDEN[problem].search(line.split("#")[0])]
    assert found == [], f"{problem} at {found}"


def test_remote_code_is_off_unless_asked_for():
    import inspect

    assert inspect.signature(models.load_model).parameters["trust_remote_code"].default is False
    for argv in (["score", "direct", "--out", "x.csv"], ["extract", "--items", "x", "--out", "x"]):
        assert build_parser().parse_args(argv).trust_remote_code is False
        assert build_parser().parse_args([*argv, "--trust-remote-code"]).trust_remote_code is True


def test_hub_downloads_take_safetensors_and_code_only_when_trusted(monkeypatch, tmp_path):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo, revision=None, allow_patterns=(): asked.append(allow_patterns) or str(tmp_path))
    models._download("org/name", None)
    models._download("org/name", None, with_code=True)
    plain, trusted = asked
    assert "*.safetensors" in plain and not {"*.bin", "*.pt", "*.pth", "*.pkl", "*.ckpt", "*.py"} & set(plain)
    assert set(trusted) - set(plain) == {"*.py"}


def test_the_api_key_reaches_the_server_but_no_output_file(tmp_path, monkeypatch, capsys):
    secret = "sk-babelprobe-test-0123456789"
    monkeypatch.setenv("BP_SECURITY_KEY", secret)
    seen = []

    class Answer(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"choices": [{"message": {"content": "Paris"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "run"
    try:
        assert main(["bench", "eclektic", "--data", "eclektic-sample", "--limit", "1", "--no-progress",
                     "--generator", f"openai:m@http://127.0.0.1:{server.server_port}/v1",
                     "--api-key-env", "BP_SECURITY_KEY", "--out", str(out)]) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert seen and all(header == f"Bearer {secret}" for header in seen)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
