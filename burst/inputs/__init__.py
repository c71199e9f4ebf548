"""The run's inputs: the data set and model-hub files a training run reads, which a node
must find where the script looks for them. Found (``recorder``, ``hubs``), chosen
(``selection``), stored in chunks (``chunks``), staged (``part``) and placed on a node
(``place``); ``names`` holds what crosses a process boundary."""
