"""The `compass` command line: one module per subcommand."""
