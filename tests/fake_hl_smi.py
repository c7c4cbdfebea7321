#!/usr/bin/env python3
"""A fake ``hl-smi`` that replays real recorded output (tests/data/hlsmi/) in the shapes hl-smi prints.

Understands ``-Q/--query-aip FIELDS``, ``-f/--format csv[,noheader][,nounits]``, ``-l N`` (loop mode:
header once, then one group of rows per period) and the plain summary table (no -Q). The card values
are the recorded HL-205 server (8 cards, index -> module id map from csv-index-module_id.txt).

Environment knobs for tests:
  FAKE_HLSMI_PERIOD=0.1        seconds between loop snapshots (real hl-smi takes whole seconds)
  FAKE_HLSMI_MODE=...          normal | unsorted | die_after:K | hang | hang_after:K | garbage | empty |
                               fail | zero_temp | na | garbage_rows | escapes | absurd | stall_mid:K
                               garbage_rows: two unparsable lines among each snapshot's rows
                               escapes: card names carry ANSI colour / title escapes and a BEL
                               absurd: utilization 250 (card 1), memory.used -5 (2), 9999 C (3)
                               stall_mid:K: after K snapshots print 3 rows, then sleep forever
                               once_then_fail:K: the first start prints K snapshots and exits 1;
                               every later start fails at once (exit 3), as a driver that went away
                               (needs FAKE_HLSMI_STATE, a file path: created by the first start)
  FAKE_HLSMI_ROW_DELAY=0.1     seconds between two rows of a snapshot (a slow or loaded driver)
  FAKE_HLSMI_TABLE=FILE        table to print in table mode (default: table-hl205-1.18.0.txt)

Doctor modes: ``-q`` prints the recorded per-card query (health/q-style-L-i-hl225-1.12.1.txt) for 8
cards, each with the module id and bus id the CSV rows give the same index (one server, one truth);
``-n link -i BUS`` prints the card's ports. FAKE_HLSMI_MODE=sick makes a sick 8-card server, the
cards named by module id (as HABANA_VISIBLE_MODULES and the doctor name them): module 1 has ports 2,5
DOWN, module 2 double-bit ECC with a pending row replacement, module 3 reads 0 C (in -q and in the
CSV rows), module 5 has power slowdown active (module 6 is held: tests hold its accel node through
a fixture /proc, and the summary table's Compute Processes lists pid 4242 'python3 train.py' on it).
FAKE_HLSMI_MODE=q_no_cards: ``-q`` prints its header and no per-card section (exit 0); the device
query and the table answer as usual.
  FAKE_HLSMI_DRIVER=1.18.0     the driver/firmware version printed by -q (default: as recorded, 1.12.1)
  FAKE_HLSMI_FIRMWARE=3,5=1.16.0   those modules' firmware version in -q differs from the driver's
  FAKE_HLSMI_THROTTLE=3=power,2=thermal   in -q those modules show that slowdown Active (the run
                               meter's throttle time)
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "hlsmi"
UNITS = {"memory.used": "MiB", "memory.total": "MiB", "memory.free": "MiB", "power.draw": "W",
         "power.max": "W", "temperature.aip": "C", "utilization.aip": "%"}


def modules() -> dict[int, str]:
    """Index -> module id of the recorded server (csv-index-module_id.txt)."""
    mapping: dict[int, str] = {}
    for line in (DATA / "csv-index-module_id.txt").read_text().splitlines()[1:]:
        position, module = (p.strip() for p in line.split(","))
        mapping[int(position)] = module
    return mapping


#: The sick server's cards, by module id (see the module's docstring).
SICK_PORTS, SICK_ECC, SICK_DEAD, SICK_SLOW, SICK_HELD = 1, 2, 3, 5, 6


def index_of(module: int) -> int:
    return next(i for i, m in modules().items() if int(m) == module)


def cards(snapshot: int, mode: str) -> list[dict[str, str]]:
    mapping = modules()
    rows = (DATA / "csv-nounits-hl205.txt").read_text().splitlines()[1:]
    out = []
    for index, line in enumerate(rows):
        name, uuid, power, temp, util, used, total = (p.strip() for p in line.split(","))
        util_now = (int(util) + 7 * snapshot + 11 * index) % 100
        card = {
            "index": str(index), "module_id": mapping[index], "name": name, "uuid": uuid,
            "serial": f"AM{index:02d}SN", "bus_id": f"0000:{0x19 + index:02x}:00.0",
            "driver_version": "1.18.0-ee698fb", "power.draw": power, "power.max": "350",
            "temperature.aip": "0" if ((mode == "zero_temp" and index == 2)
                                       or (mode == "sick" and mapping[index] == str(SICK_DEAD))) else temp,
            "utilization.aip": str(util_now), "memory.used": used, "memory.total": total,
            "memory.free": str(int(total) - int(used)), "timestamp": time.strftime("%c"),
        }
        if mode == "na":
            card["power.draw"] = "N/A"
            card["serial"] = "N/A"
        if mode == "escapes":
            card["name"] = f"\x1b[31m{name}\x1b[0m\x1b]0;pwned\x07\x1b[2J"
        if mode == "absurd":
            card["utilization.aip"] = {1: "250"}.get(index, card["utilization.aip"])
            card["memory.used"] = {2: "-5"}.get(index, card["memory.used"])
            card["temperature.aip"] = {3: "9999"}.get(index, card["temperature.aip"])
        out.append(card)
    if mode == "unsorted":
        order = [3, 1, 2, 0, 7, 5, 6, 4]
        out = [out[i] for i in order]
    return out


def query(mode: str) -> str:
    """``hl-smi -q``: the recorded card block repeated for 8 cards, sick ones altered in mode sick."""
    lines = (DATA / "health" / "q-style-L-i-hl225-1.12.1.txt").read_text().splitlines()
    lines = [ln for ln in lines if not ln.startswith("#") and "$" not in ln]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("[0] AIP"))
    head, block = "\n".join(lines[:start]), "\n".join(lines[start:])
    out = [head]
    mapping = modules()
    firmware: dict[int, str] = {}
    spec = os.environ.get("FAKE_HLSMI_FIRMWARE", "")
    if "=" in spec:
        ids, version = spec.split("=", 1)
        firmware = {int(m): version for m in ids.split(",") if m.strip()}
    for i in range(8):
        bus = f"0000:{0x19 + i:02x}:00.0"
        module = int(mapping[i])
        card = block.replace("[0] AIP (accel0) 0000:43:00.0", f"[{i}] AIP (accel{i}) {bus}")
        card = card.replace("Module ID                       : 0",
                            f"Module ID                       : {module}")
        card = card.replace("Bus Id                  : 0000:43:00.0", f"Bus Id                  : {bus}")
        if module in firmware:
            card = card.replace("hl-gaudi2-1.12.1-fw", f"hl-gaudi2-{firmware[module]}-fw")
        if mode == "sick" and module == SICK_ECC:
            card = card.replace("Double Bit ECC          : 0", "Double Bit ECC          : 2")
            card = card.replace("Pending                 : No", "Pending                 : Yes")
        if mode == "sick" and module == SICK_DEAD:
            card = re.sub(r"(\[\s*\d+\] [^:\n]*(?:Chip|HBM|Board|Temp)[^:\n]*:)\s*\d+ C", r"\1  0 C", card)
        for spec_item in filter(None, os.environ.get("FAKE_HLSMI_THROTTLE", "").split(",")):
            which, reason = spec_item.split("=")
            if int(which) == module:
                label = {"power": "Power", "thermal": "Thermal", "hw": "HW"}[reason]
                card = re.sub(rf"({label} Slowdown\s*:\s*)Not Active", r"\1Active", card)
        if mode == "sick" and module == SICK_SLOW:
            card = card.replace("""Power Slowdown
                                        : Not Active""", """Power Slowdown
                                        : Active""")
        out.append(card)
    text = "\n".join(out) + "\n"
    driver = os.environ.get("FAKE_HLSMI_DRIVER")
    return text.replace("1.12.1", driver) if driver else text


def links(bus: str, mode: str) -> str:
    index = int(bus.split(":")[1], 16) - 0x19
    down = {2, 5} if (mode == "sick" and modules().get(index) == str(SICK_PORTS)) else set()
    return "".join(f"port {p:2d}:\t{'DOWN' if p in down else 'UP'}\n" for p in range(24))


def main(argv: list[str]) -> int:
    mode = os.environ.get("FAKE_HLSMI_MODE", "normal")
    if argv[:1] == ["-q"]:
        text = query(mode)
        if mode == "q_no_cards":
            # An hl-smi that answers -q with its header and no per-card section (exit 0).
            text = text[:text.index("[0] AIP")]
        sys.stdout.write(text)
        return 0
    if argv[:2] == ["-n", "link"] and len(argv) == 4 and argv[2] == "-i":
        sys.stdout.write(links(argv[3], mode))
        return 0
    fields: list[str] | None = None
    fmt = "csv"
    loop: float | None = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-Q", "--query-aip"):
            fields = [f.strip() for f in args.pop(0).split(",")]
        elif arg.startswith("--query-aip="):
            fields = arg.split("=", 1)[1].split(",")
        elif arg in ("-f", "--format"):
            fmt = args.pop(0)
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg in ("-l", "--loop"):
            loop = float(args.pop(0))
        else:
            print(f"hl-smi: unknown option {arg}", file=sys.stderr)
            return 2
    if mode.startswith("once_then_fail:"):
        state = Path(os.environ["FAKE_HLSMI_STATE"])
        if state.exists():
            mode = "fail"
        else:
            state.touch()
            mode = f"die_after:{mode.split(':')[1]}"
    if mode == "fail":
        print("hl-smi: failed to initialize: no Habana devices found", file=sys.stderr)
        return 3
    if mode == "empty":
        return 0
    if mode == "garbage":
        print("Segmentation fault? \x00\x01 ### not csv at all")
        return 0
    if fields is None:
        table = Path(os.environ.get("FAKE_HLSMI_TABLE", DATA / "table-hl205-1.18.0.txt"))
        text = table.read_text()
        if mode == "sick":
            # hl-smi's own process list on the sick server: module 6 held by pid 4242 (the fixture
            # /proc holds it too), nothing else; the recorded rows for AIPs 0 and 6 are made idle.
            idle = "|   {}        N/A   N/A    N/A                                      N/A        |"
            for aip in (0, 6):
                text = re.sub(rf"^\|   {aip}        \S+ .*\|$", idle.format(aip), text, flags=re.MULTILINE)
            aip = index_of(SICK_HELD)
            held = f"|   {aip}        4242  C      python3 train.py" + " " * 25 + "2040MiB    |"
            text = re.sub(rf"^\|   {aip}        \S+ .*\|$", held, text, flags=re.MULTILINE)
        sys.stdout.write(text)
        return 0
    opts = fmt.split(",")
    header, units = "noheader" not in opts, "nounits" not in opts
    if header:
        print(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in fields), flush=True)
    period = float(os.environ.get("FAKE_HLSMI_PERIOD", loop or 1))
    row_delay = float(os.environ.get("FAKE_HLSMI_ROW_DELAY", "0"))
    snapshot = 0
    while True:
        if mode == "hang" or (mode.startswith("hang_after:") and snapshot >= int(mode.split(":")[1])):
            time.sleep(3600)
        stall = mode.startswith("stall_mid:") and snapshot >= int(mode.split(":")[1])
        for position, card in enumerate(cards(snapshot, mode)):
            if stall and position == 3:
                sys.stdout.flush()
                time.sleep(3600)
            if mode == "garbage_rows" and position == 4:
                print("### hl-smi: \x1b[31mdriver busy\x1b[0m ###")
                print("3, 7")  # a truncated row
            values = []
            for f in fields:
                value = card.get(f, "N/A")
                if units and f in UNITS and value != "N/A":
                    value = f"{value} {UNITS[f]}"
                values.append(value)
            print(", ".join(values))
            if row_delay:
                sys.stdout.flush()
                time.sleep(row_delay)
        sys.stdout.flush()
        snapshot += 1
        if mode.startswith("die_after:") and snapshot >= int(mode.split(":")[1]):
            print("hl-smi: lost connection to the driver", file=sys.stderr)
            return 1
        if loop is None:
            return 0
        time.sleep(period)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
