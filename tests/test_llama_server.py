"""Our exported GGUF served like any model: llama-cpp-python's OpenAI-compatible server
(``python -m llama_cpp.server``, the ``server`` extra) on the F32 export of a model trained here, asked
through the ``openai`` client's chat.completions with the chat template in the file, answers as the app
does (ChatSession, greedy), over several turns and with a system message.

The model is :func:`tests.test_gguf.get_trained` (d_model 32, 60 + 60 steps: a few seconds, shared with
tests/test_llama_cpp.py in one session); the server starts in about a second on a free port and is always
stopped.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from core import chat_format
from core.chat import ChatSession
from core.checkpoint import load_model
from core.generate import Generator, SamplingSettings
from tests.test_gguf import get_trained

N_CTX = 64  # = the model's context_length
READY_TIMEOUT_S = 60.0
MAX_TOKENS = 40


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model: Path, port: int) -> list[str]:
    """The README's command, with an F32 KV cache (as our attention) and 2 threads."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", "2", "--n_threads_batch", "2",
            "--type_k", "0", "--type_v", "0", "--seed", "0", "--verbose", "False"]


def wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llama_cpp.server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    pytest.fail(f"llama_cpp.server not ready after {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def trained(device, tmp_path_factory):
    return get_trained(device, tmp_path_factory)


@pytest.fixture(scope="module")
def server(trained, tmp_path_factory):
    """``(openai client, model id)`` of a server on the F32 export; the server is killed afterwards."""
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(serve_command(trained.gguf["f32"], port), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/v1/models", log)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60.0,
                               max_retries=0)
        yield client, client.models.list().data[0].id
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def app_model(trained, device):
    """Our generator and tokenizer on the weights read back from the same F32 file."""
    loaded = load_model(trained.gguf["f32"])
    return Generator(device, loaded.config, loaded.weights), loaded.tokenizer


def ask(server, tok, messages: list[dict], max_tokens: int = MAX_TOKENS) -> str:
    """The server's greedy answer to ``messages`` (the app's stop strings: its next ``User:`` turn)."""
    client, model = server
    resp = client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=max_tokens,
                                          stop=chat_format.stop_strings(tok) or None, seed=0)
    return (resp.choices[0].message.content or "").strip()


def test_server_uses_the_files_chat_template_and_answers_like_the_app(server, app_model, trained):
    gen, tok = app_model
    settings = SamplingSettings(temperature=0.0, max_tokens=MAX_TOKENS)
    dialogues = trained.dataset.dialogues
    taught = 0
    for index in (0, 5, 9):
        question, want = dialogues[index].turns[0]
        ours = ChatSession(gen, tok).answer(question, settings)
        theirs = ask(server, tok, [{"role": "user", "content": question}])
        assert theirs == ours, f"dialogue {index}: {question!r}"
        taught += ours == want.strip()
    assert taught, "the model answers none of the asked questions as it was taught"


def test_server_keeps_a_conversation_with_a_system_message_like_the_app(server, app_model, trained):
    gen, tok = app_model
    system = "Be brief."
    session = ChatSession(gen, tok, system=system)
    messages = [{"role": "system", "content": system}]
    for d in (trained.dataset.dialogues[i] for i in (7, 10)):  # short turns: two fit the 64 tokens
        question = d.turns[0][0]
        # the whole conversation and the answer fit the context: the session keeps every turn
        room = N_CTX - 1 - len(chat_format.prompt_ids(tok, session.history, question, system=system))
        assert room >= 4
        ours = session.answer(question, SamplingSettings(temperature=0.0, max_tokens=min(room, 12)))
        messages.append({"role": "user", "content": question})
        theirs = ask(server, tok, messages, min(room, 12))
        assert theirs == ours, f"turn {len(messages) // 2}: {question!r}"
        messages.append({"role": "assistant", "content": theirs})
    assert len(session.history) == 2
