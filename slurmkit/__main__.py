from slurmkit.cli.app import main

main()
