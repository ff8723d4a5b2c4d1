"""`verify audit`: the audit of a user's model, one module per part.

`pipeline` runs it and writes its output files; `config` holds its settings and record constants; `measure` the
kernels, influence, flip rates and sharpness of one network; `risk` the risk rule; `ci` the record check,
`--fail-on`, the summary and `diff`; the panels are `budget`, `validity` and `outcome`, their re-fits in `refit`;
`projection` the projected kernel of a large model.
"""
