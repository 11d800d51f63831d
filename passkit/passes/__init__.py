"""Built-in passes, one stage per module. Each module is a plugin registered through the same
``passkit_register_passes`` hook that third-party plugins use."""
