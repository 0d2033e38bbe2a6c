"""RocketMQ's remoting protocol, the wire of RocketMQ 4.x clients: the command frame and its two
header serializations (``command``), the request and response codes (``codes``), and the message
record, property string and message ids a 4.x client reads and writes (``record``). Pure: no
sockets, no clock; what a code means to the NameServer or a broker is theirs
(``namesrv.remoting``, ``broker.frontends.remoting``)."""

__all__: list[str] = []
