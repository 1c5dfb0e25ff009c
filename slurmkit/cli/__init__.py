"""The Typer CLI: thin command modules that parse, call the library and print."""
