"""Train a small CNN on the bundled handwritten digits; see megbrain/examples/digits.py."""

from megbrain.examples.digits import main

if __name__ == "__main__":
    main()
