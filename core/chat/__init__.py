"""Conversations and replies: templates, template fitting, tool calls, and the one request/reply
path every front end (the LangChain and LlamaIndex adapters, the server) uses."""
