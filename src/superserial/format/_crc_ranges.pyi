from typing_extensions import Buffer

def crc32c_ranges(
    extend: int, data: Buffer, starts: Buffer, lengths: Buffer, out: Buffer
) -> None: ...
