"""The remoting protocol's numbers: request codes (what a 4.x client or a broker asks), response
codes (how the answer went), the flag bits and the header serializations. The values are
RocketMQ's (``RequestCode``, ``ResponseCode``); only the ones dledger serves or sends are named."""

from __future__ import annotations

# -- request codes -------------------------------------------------------------------------------
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
GET_EARLIEST_MSG_STORETIME = 32
VIEW_MESSAGE_BY_ID = 33
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
END_TRANSACTION = 37
GET_CONSUMER_LIST_BY_GROUP = 38
CHECK_TRANSACTION_STATE = 39  # broker -> producer
NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> consumer
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
CHECK_CLIENT_CONFIG = 46
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
GET_CONSUMER_RUNNING_INFO = 307  # broker -> consumer
CONSUME_MESSAGE_DIRECTLY = 309  # broker -> consumer
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320

# -- response codes ------------------------------------------------------------------------------
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_DISK_TIMEOUT = 10
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22
SUBSCRIPTION_PARSE_FAILED = 23
SUBSCRIPTION_NOT_EXIST = 24
INVALID_PARAMETER = 29
CONSUMER_NOT_ONLINE = 206

# -- the header word and the flag ----------------------------------------------------------------
JSON = 0  # the header's serialization, in the high byte of the frame's second word
ROCKETMQ = 1  # RocketMQ's own binary header form
FLAG_RESPONSE = 1  # bit 0: a response
FLAG_ONEWAY = 2  # bit 1: a request that wants no response

# A language's byte in the binary header (RocketMQ's LanguageCode), by name and back.
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP",
             "GO", "PHP", "OMS", "RUST", "NODE_JS")
SERVER_LANGUAGE = "PYTHON"  # what dledger's own commands say they are
SERVER_VERSION = 401  # a 4.x broker's version number (V4_9_x), for clients that gate on it

# -- topics and permissions ----------------------------------------------------------------------
AUTO_CREATE_TOPIC = "TBW102"  # a 4.x producer's stand-in route for a topic not created yet
PERM_INHERIT, PERM_READ, PERM_WRITE = 1, 4, 2  # RocketMQ's PermName bits
