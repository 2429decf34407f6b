"""python -m minigen: the same CLI as the `minigen` command."""
from .cli import main

if __name__ == "__main__":
    main()
