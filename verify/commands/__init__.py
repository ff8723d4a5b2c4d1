"""One module per `verify` subcommand (discovered by `verify.cli`)."""
