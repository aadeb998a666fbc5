"""The omnivox server: the command line, the app, and its calls, protocol and operations."""
