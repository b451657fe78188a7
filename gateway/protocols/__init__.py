"""The client protocols served besides OpenAI chat/completions, by path: each parses into the chat
RequestContext at the edge and renders the chat answer back in its own shape (see base.py)."""

from __future__ import annotations

from gateway.protocols.anthropic import AnthropicWire
from gateway.protocols.base import Wire
from gateway.protocols.responses import ResponsesWire

WIRES: dict[str, Wire] = {"/v1/responses": ResponsesWire(), "/v1/messages": AnthropicWire()}
