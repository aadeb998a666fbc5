"""Operations: logs, metrics, event-loop lag, readiness and call records."""
