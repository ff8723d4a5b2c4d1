"""The base layer every package may import: the user-input error, shared file IO and the JSON codec.

`errors` (`UserInputError`), `io` (atomic writes, file digests) and `codec` (the one JSON codec).
`ntkm` imports none of `theory`, `empirics`, `verify` or `reports` (tests/test_layering.py checks it),
so each of those may raise `ntkm.errors.UserInputError` and read and write files with `ntkm`.
"""
