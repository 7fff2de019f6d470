// Talaria dashboard: the little the pages need a script for. Everything
// a chat or a client wrote is put into the page as text (textContent),
// never as HTML.
"use strict";

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.getAttribute("content") : "";
}

// Forms that ask before they change something (data-confirm).
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// Calls an API route through the dashboard's pass-through.
async function api(method, path, body) {
  const response = await fetch("/ui/api" + path, {
    method,
    headers: { "content-type": "application/json", "x-csrf-token": csrfToken() },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  let answer = null;
  try {
    answer = await response.json();
  } catch (_) {
    answer = null;
  }
  if (!response.ok) {
    const message = answer && answer.error && answer.error.message;
    throw new Error(message || "The request failed (" + response.status + ")");
  }
  return answer;
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setupChat(chat) {
  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-input");
  const send = document.getElementById("chat-send");
  const stop = document.getElementById("chat-stop");
  const status = document.getElementById("chat-status");
  const conversation = document.getElementById("conversation");
  const fileInput = document.getElementById("chat-file");
  const fileNames = document.getElementById("chat-files");
  let current = null;

  // The API takes at most 10 MiB a request, and files travel as base64
  // (a third larger).
  const MAX_FILE_BYTES = 7 * 1024 * 1024;

  fileInput.addEventListener("change", () => {
    fileNames.textContent = Array.from(fileInput.files).map((f) => f.name).join(", ");
  });

  function dataUrl(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(reader.result);
      reader.onerror = () => reject(new Error("Cannot read " + file.name));
      reader.readAsDataURL(file);
    });
  }

  function scrollDown() {
    window.scrollTo(0, document.body.scrollHeight);
  }

  function busy(on) {
    send.disabled = on;
    input.disabled = on;
    fileInput.disabled = on;
    stop.hidden = !on;
  }

  function addMessage(role, text) {
    const item = element("li", "msg " + role);
    item.appendChild(element("div", "who", role));
    const body = element("div", "text", text);
    item.appendChild(body);
    conversation.appendChild(item);
    scrollDown();
    return { item, body };
  }

  function showApproval(run, event, answer) {
    const box = element("div", "approval");
    box.setAttribute("data-approval", event.approval_id);
    box.appendChild(element("p", "", "The agent wants to run a command that needs your approval:"));
    box.appendChild(element("pre", "", event.command || ""));
    if (event.reason) box.appendChild(element("p", "muted", event.reason));
    const buttons = element("div", "approval-buttons");
    const labels = { once: "Allow once", session: "Allow for this session", always: "Always allow", deny: "Deny" };
    for (const choice of event.choices || []) {
      const button = element("button", choice === "deny" ? "danger" : "", labels[choice] || choice);
      button.type = "button";
      button.setAttribute("data-decision", choice);
      button.addEventListener("click", async () => {
        for (const b of buttons.querySelectorAll("button")) b.disabled = true;
        try {
          await api("POST", "/v1/runs/" + encodeURIComponent(run) + "/approval", {
            decision: choice,
            approval_id: event.approval_id,
          });
        } catch (error) {
          box.appendChild(element("p", "error-text", error.message));
          for (const b of buttons.querySelectorAll("button")) b.disabled = false;
        }
      });
      buttons.appendChild(button);
    }
    box.appendChild(buttons);
    answer.item.appendChild(box);
    scrollDown();
  }

  function follow(run, answer) {
    let text = "";
    const source = new EventSource("/ui/api/v1/runs/" + encodeURIComponent(run) + "/events");
    const finish = (message) => {
      source.close();
      current = null;
      busy(false);
      status.textContent = message;
      input.focus();
    };
    source.onmessage = (frame) => {
      let event;
      try {
        event = JSON.parse(frame.data);
      } catch (_) {
        return;
      }
      switch (event.event) {
        case "message.delta":
          text += event.delta || "";
          answer.body.textContent = text;
          scrollDown();
          break;
        case "message.restarted":
          text = "";
          answer.body.textContent = "";
          break;
        case "tool.started": {
          const line = element("div", "tool-line", "\u2699 " + event.tool + " \u2026");
          answer.item.insertBefore(line, answer.body);
          break;
        }
        case "tool.completed": {
          const lines = answer.item.querySelectorAll(".tool-line:not(.done)");
          const line = lines[lines.length - 1];
          if (line) {
            line.textContent = (event.ok ? "\u2713 " : "\u2717 ") + event.tool;
            line.classList.add("done");
          }
          break;
        }
        case "approval.request":
          status.textContent = "Waiting for your approval";
          showApproval(run, event, answer);
          break;
        case "approval.responded": {
          const box = answer.item.querySelector('[data-approval="' + CSS.escape(event.approval_id) + '"]');
          if (box) {
            box.replaceChildren(element("p", "muted", "Answered: " + event.decision));
          }
          status.textContent = "Working";
          break;
        }
        case "run.completed":
          if (typeof event.output === "string" && event.output.length > 0) {
            answer.body.textContent = event.output;
          }
          finish("");
          break;
        case "run.cancelled":
          finish("Stopped.");
          break;
        case "run.failed":
          answer.item.appendChild(element("p", "error-text", event.error || "The turn failed."));
          finish("Failed.");
          break;
        default:
          break;
      }
    };
    // The browser reconnects on its own, sending the last event id, so a
    // dropped connection resumes where it stopped.
    source.onerror = () => {
      if (current) status.textContent = "Reconnecting\u2026";
    };
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const message = input.value.trim();
    const files = Array.from(fileInput.files);
    if ((!message && files.length === 0) || current) return;
    const total = files.reduce((sum, f) => sum + f.size, 0);
    if (total > MAX_FILE_BYTES) {
      status.textContent = "The files are too large: at most 7 MB in all.";
      return;
    }
    const names = files.map((f) => "[" + f.name + "]").join(" ");
    addMessage("user", [message, names].filter((s) => s).join("\n"));
    input.value = "";
    busy(true);
    status.textContent = "Working";
    const answer = addMessage("assistant", "");
    const body = {};
    try {
      if (files.length === 0) {
        body.input = message;
      } else {
        // Files go as content parts of the message, as a chat completion
        // sends them; the server sniffs what each one is from its bytes.
        const parts = [];
        if (message) parts.push({ type: "text", text: message });
        for (const file of files) {
          parts.push({ type: "image_url", image_url: { url: await dataUrl(file) } });
        }
        body.input = [{ role: "user", content: parts }];
        fileInput.value = "";
        fileNames.textContent = "";
      }
      if (chat.dataset.session) body.session_id = chat.dataset.session;
      const run = await api("POST", "/v1/runs", body);
      current = run.id;
      if (run.session_id && run.session_id !== chat.dataset.session) {
        chat.dataset.session = run.session_id;
        history.replaceState(null, "", "/ui/chat?session=" + encodeURIComponent(run.session_id));
      }
      follow(run.id, answer);
    } catch (error) {
      answer.item.appendChild(element("p", "error-text", error.message));
      busy(false);
      status.textContent = "";
    }
  });

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  stop.addEventListener("click", async () => {
    if (!current) return;
    try {
      await api("POST", "/v1/runs/" + encodeURIComponent(current) + "/stop");
    } catch (error) {
      status.textContent = error.message;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const chat = document.getElementById("chat");
  if (chat) setupChat(chat);
});
