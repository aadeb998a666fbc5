"""The HTTP surface: signalling routes, authentication, records route, and their errors."""
