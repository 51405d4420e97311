"""`python -m embodichain` runs the CLI (also the torchrun entry: `torchrun -m embodichain`)."""

from embodichain.cli import main

if __name__ == "__main__":
    main()
