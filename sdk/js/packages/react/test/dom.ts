// A DOM for React and Testing Library in Node (happy-dom), imported before
// them. Only what they need becomes global: the SDK keeps Node's own fetch,
// and no WebSocket class appears, so every test names its transport.
import { Window } from "happy-dom";

const window = new Window({ url: "http://localhost/" });
const names = [
  "window", "document", "navigator", "location",
  "Node", "Element", "HTMLElement", "HTMLIFrameElement", "HTMLInputElement", "HTMLButtonElement", "SVGElement", "Text", "DocumentFragment",
  "Event", "CustomEvent", "UIEvent", "MouseEvent", "KeyboardEvent", "FocusEvent", "InputEvent", "PointerEvent",
  "MutationObserver", "getComputedStyle", "requestAnimationFrame", "cancelAnimationFrame",
] as const;
const g = globalThis as Record<string, unknown>;
for (const name of names) {
  const value = name === "window" ? window : (window as unknown as Record<string, unknown>)[name];
  g[name] = typeof value === "function" && /^[a-z]/.test(name) ? (value as Function).bind(window) : value;
}
// React's act() environment: Testing Library's render and waitFor set it
// around their own work; updates from the stream come between.
g.IS_REACT_ACT_ENVIRONMENT = false;

/** closeDom ends the window's timers and tasks, so that node can exit. */
export const closeDom = () => window.happyDOM.close();
