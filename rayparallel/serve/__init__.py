"""`rayparallel serve`: live stateful streams, each in a batch slot of a replica.

The path of one window:

    client --HTTP--> front (HAProxy: hash of the stream on the ring of live replicas)   front.py
           --HTTP--> the stream's replica: KServe v2 parsed and checked                 endpoints.py, protocol.py
                     its slot (Triton's Direct strategy)                                 slots.py
                     one compiled step of every slot with a waiting window               slot_model.py
                     the step's states committed to the keeper, then the answer         kept_states.py
           <-------- KServe v2 JSON answer
"""
