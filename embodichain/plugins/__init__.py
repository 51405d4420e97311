"""The built-in `sl_ddp` recipe: its factory (`sl_ddp`), its torch-free schema
(`sl_ddp_schema`) and the packaged recipe YAML for `embodichain init` (`recipes/`)."""
