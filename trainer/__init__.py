"""trainer: fleet API, parameter server, collective backend (see issue 3)."""
