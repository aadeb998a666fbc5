"""The stage processes: worker, supervisor, the API process's clients and the wire between them."""
