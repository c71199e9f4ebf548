"""What the environment (:mod:`burst.env`) and the run's inputs (:mod:`burst.inputs`) both
stage with, from a thread of a training process: the part protocol a background stager
walks (``parts``: what the store still lacks, and the uplink share it may use), helper
programs run without a pipe a forked DataLoader worker could inherit (``spawn``), and
where the wheel cache lies, whose reads are the stager's and never the run's inputs
(``wheelcache``).

It sits below both packages so that their imports run one way: ``env`` stages the inputs
as one of its parts (``env`` imports ``inputs``), and ``inputs`` needs only these
primitives, never ``env`` itself."""
