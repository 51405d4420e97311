"""The old `python -m embodichain_models.policies.aloha.prepare`, kept working because users
have it in their shell history: it runs `python -m embodichain_models.data.aloha.prepare`
(where the recorder now lives) with the same arguments. New scripts should use the new path.
(move56-keep: this file names the old path on purpose.)"""

from __future__ import annotations

from embodichain_models.data.aloha.prepare import main

if __name__ == "__main__":
    main()
