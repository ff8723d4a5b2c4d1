"""`verify audit`: the audit of a user's model, one module per part.

`modelio` loads the user's model without running its code and binds it to the data; `pipeline` runs the
audit and writes its output files; `config` holds its settings and record constants; `measure` the
kernels, influence, flip rates and sharpness of one network; `risk` the risk rule; `ci` the record check,
`--fail-on`, the summary and `diff`; the panels are `budget`, `validity` and `outcome`, their re-fits in `refit`;
`projection` the projected kernel of a large model.
"""
