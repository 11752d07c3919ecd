"""`python -m daemon` is the same as the `edge-inferd` console script."""

from daemon.cli import main

if __name__ == "__main__":
    main()
