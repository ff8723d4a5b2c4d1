"""Attribution: NTK leave-one-out influence, the Gauss-Newton family computed from the kernel, and the field's
attribution libraries as estimators of the audit."""
