"""One module a command: what each does once :mod:`experiments.cli` has parsed
its flags. Each command's function takes the parsed arguments and returns the
exit status; it prints results on stdout, progress on stderr."""
