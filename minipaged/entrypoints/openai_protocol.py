# GENERATED from chapters/17_openai_server.md by tools/export.py -- DO NOT EDIT.
# Change the chapter, then run `make export`.

# %% chapters/17_openai_server.md § The OpenAI protocol
"""The request bodies of OpenAI's completions and chat API, and its error shape."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["OpenAIError", "StreamOptions", "CompletionRequest", "ChatMessage",
           "ChatCompletionRequest", "error_body"]


class OpenAIError(Exception):
    """An error the server answers in OpenAI's shape, with an HTTP status."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# %% chapters/17_openai_server.md § The OpenAI protocol
class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _SamplingFields(_Body):
    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None        # vLLM's extension
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False        # vLLM's extension
    include_stop_str_in_output: bool = False


class CompletionRequest(_SamplingFields):
    prompt: str | list[int]
    logprobs: int | None = None


class ChatMessage(_Body):
    role: str
    content: str


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
