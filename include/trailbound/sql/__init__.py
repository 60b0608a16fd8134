"""SQL shipped with the engine: the metadata store's forward-only migrations (migrations/),
read by `trailbound.metadata` as package resources. No Python lives here."""
