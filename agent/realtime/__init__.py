"""The OpenAI Realtime protocol: events, the conversation session, replies and history."""
