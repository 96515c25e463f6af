"""opcheck's pytest plugins, one per module, registered by opcheck.plugin (the entry point)."""
