// A parser of the text/event-stream format (the HTML standard's "Server-sent
// events", §9.2.6), fed text as it arrives: lines end in CRLF, LF or CR,
// and a chunk may end anywhere, even between the CR and the LF of one line
// end. Small enough to need no dependency.

/** One dispatched event. */
export interface ServerSentEvent {
  /** `event:`, or "message". */
  type: string;
  /** The `data:` lines, joined with LF. */
  data: string;
  /** The last `id:` seen so far: what `Last-Event-ID` would send. */
  lastEventId: string;
}

/** EventStreamParser turns pushed text into events, in order. */
export class EventStreamParser {
  /** The last event id set by an `id:` field (kept across events, as the standard says). */
  lastEventId = "";
  /** The last `retry:` value, in ms, if any. */
  retry?: number;
  private line = "";
  private data = "";
  private hasData = false;
  private type = "";
  private afterCR = false;
  private started = false;

  constructor(
    private readonly onEvent: (event: ServerSentEvent) => void,
    private readonly onComment?: (text: string) => void,
  ) {}

  /** push takes the next piece of decoded text. */
  push(text: string): void {
    let i = 0;
    if (!this.started && text) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) i = 1; // one leading BOM is not content
    }
    if (this.afterCR && i < text.length) {
      this.afterCR = false;
      if (text[i] === "\n") i++; // the LF of a CRLF split across chunks
    }
    while (i < text.length) {
      const cr = text.indexOf("\r", i);
      const lf = text.indexOf("\n", i);
      const end = cr < 0 ? lf : lf < 0 ? cr : Math.min(cr, lf);
      if (end < 0) {
        this.line += text.slice(i);
        return;
      }
      const line = this.line + text.slice(i, end);
      this.line = "";
      i = end + 1;
      if (text[end] === "\r") {
        if (i === text.length) this.afterCR = true;
        else if (text[i] === "\n") i++;
      }
      this.field(line);
    }
  }

  private field(line: string): void {
    if (line === "") return this.dispatch();
    if (line[0] === ":") return this.onComment?.(line.slice(1).replace(/^ /, ""));
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    switch (name) {
      case "data":
        this.data += value + "\n";
        this.hasData = true;
        break;
      case "event":
        this.type = value;
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      // Any other field is ignored.
    }
  }

  private dispatch(): void {
    const { hasData, type } = this;
    const data = this.data.slice(0, -1);
    this.data = "";
    this.hasData = false;
    this.type = "";
    if (hasData) this.onEvent({ type: type || "message", data, lastEventId: this.lastEventId });
  }
}
